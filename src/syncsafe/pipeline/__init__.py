"""The pipeline's stages, declared once: dvc.yaml, the stage entries and the nightly DAG's order come from here.

Top of the import graph (only `syncsafe.cli` sits above it). Importing this
package loads nothing else: each stage's import closure stays its own.
"""
