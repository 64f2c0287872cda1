"""The tool-call syntax a policy turn uses: ``name(argument)``, one call per turn.

Kept to characters a character-level tokenizer has (letters, digits, parentheses), so the tiny
model can emit it: ``search(zorvex city)``, ``answer(kamir)``, ``go(north)``. A policy turn ends
with the end-of-turn token (eos); its text, decoded only to be parsed, is the whole call. A turn
that is not a call is the model's mistake: the environment answers it with an error message (a
masked observation) and the episode goes on. Parsing never raises.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CALL = re.compile(r"^\s*([a-z_]+)\((.*)\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class ToolCall:
    name: str
    argument: str


def parse_call(text: str) -> ToolCall | None:
    """The call written in a policy turn, or ``None`` when the turn is not ``name(argument)``."""
    match = CALL.match(text)
    return ToolCall(match.group(1), match.group(2).strip()) if match else None
