"""Controller knobs chosen on load the judging never sees, and the headroom an online controller has."""
