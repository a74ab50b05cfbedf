"""The building blocks every params section shares: the strict base model, number types, the error."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Discriminator, Field, Tag

from syncsafe.errors import BadInput

#: Controller policies the trace-time controller can run (derived schedules
#: `matched_random`, `no_sync` and `offline_bound` come from the schedules stage).
CONTROLLER_POLICIES = (
    "fixed_h",
    "pressure_gate",
    "random_deferral",
    "wa_diloco",
    "wa_calibrated",
    "wa_forecast",
    "wa_seasonal",
    "wa_lookahead",
)

#: Score terms a controller policy can run without (`<policy>-<term>`, e.g. `wa_diloco-pressure`): an ablated
#: variant is the same policy class with that term's weight at zero (`lookahead`: a horizon of one cycle).
ABLATABLE_TERMS: dict[str, tuple[str, ...]] = {
    "wa_diloco": ("progress", "staleness", "pressure"),
    "wa_calibrated": ("progress", "staleness", "pressure", "cost"),
    "wa_forecast": ("progress", "staleness", "pressure", "forecast"),
    "wa_seasonal": ("progress", "staleness", "pressure", "forecast"),
    "wa_lookahead": ("progress", "staleness", "lookahead"),
}


def split_policy(name: str) -> tuple[str, str | None]:
    """(base policy, ablated term or None) of a controller policy name; ValueError naming what is allowed."""
    if name in CONTROLLER_POLICIES:
        return name, None
    base, sep, term = name.partition("-")
    if sep and base in ABLATABLE_TERMS and term in ABLATABLE_TERMS[base]:
        return base, term
    variants = [f"{b}-{t}" for b, terms in ABLATABLE_TERMS.items() for t in terms]
    raise ValueError(f"{name!r} is not a controller policy: one of {list(CONTROLLER_POLICIES)} or an ablated "
                     f"variant {variants}")


def policy_label(name: str) -> str:
    """How reports print a policy: an ablated variant reads `wa_diloco−pressure` (a minus sign)."""
    return name.replace("-", "\u2212") if "-" in name and name.partition("-")[0] in ABLATABLE_TERMS else name


def _controller_policy(name: str) -> str:
    split_policy(name)
    return name


#: A controller policy name in params: one of CONTROLLER_POLICIES or `<policy>-<term>` (ABLATABLE_TERMS).
PolicyName = Annotated[str, AfterValidator(_controller_policy)]


#: vLLM server arguments its identity depends on (loopback bind, free port, random
#: served name): the replay sets them, params and DAGs may not.
RESERVED_SERVER_ARGS = ("--host", "--port", "--served-model-name", "--uds")


class ConfigError(BadInput):
    """params.yaml is missing, malformed or describes an impossible run."""


class Strict(BaseModel):
    # `.inf` / `.nan` in params.yaml are refused like any impossible value, naming the key.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


PositiveFloat = Annotated[float, Field(gt=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]

#: Tags of a value given once for every regime or per regime; error messages leave them out of the key.
ONE_VALUE, PER_REGIME = "<one value>", "<per regime>"
UNION_TAGS = (ONE_VALUE, PER_REGIME)

#: A positive number for every regime, or a mapping regime -> positive number.
PerRegimeFloat = Annotated[
    Annotated[PositiveFloat, Tag(ONE_VALUE)] | Annotated[dict[str, PositiveFloat], Tag(PER_REGIME)],
    Discriminator(lambda v: PER_REGIME if isinstance(v, dict) else ONE_VALUE),
]


def max_num_seqs(server_args: Sequence[str]) -> int | None:
    """The value of `--max-num-seqs` in vLLM server arguments, or None."""
    args = list(server_args)
    for i, arg in enumerate(args):
        m = re.fullmatch(r"--max[-_]num[-_]seqs(?:=(\d+))?", arg)
        if m:
            value = m.group(1) if m.group(1) is not None else (args[i + 1] if i + 1 < len(args) else None)
            if value is None or not str(value).isdigit() or int(value) < 1:
                raise ValueError(f"server_args: --max-num-seqs needs a positive whole number (got {value!r})")
            return int(value)
    return None
