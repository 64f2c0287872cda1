"""The sandbox's errors: the sandbox failed, so there is no result (``base`` says how that is told apart)."""

from __future__ import annotations

from astraflow.core.errors import AstraFlowError


class SandboxError(AstraFlowError):
    """The sandbox itself failed: the program did not run, so there is no result to score."""


class SandboxUnavailableError(SandboxError):
    """No sandbox backend works on this machine; the message says what to install or enable."""
