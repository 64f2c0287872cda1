"""The fallback backend: util-linux ``unshare`` namespaces, with the filesystem built by the launcher.

For machines without bubblewrap but with unprivileged user namespaces. ``unshare`` creates the
user (the caller mapped to root inside), pid, net, mount, ipc and uts namespaces; the launcher
(``launcher.py`` step 1) then builds the same filesystem bubblewrap would, ``pivot_root``s into
it, detaches the host's root and drops every capability before it starts the program. The tmpfs
mounts are made under ``{throwaway}/root``, a host directory used only as a mount point; they
exist in the sandbox's mount namespace alone.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from astraflow.sandbox.base import WORKDIR, Sandbox
from astraflow.sandbox.host import system_mounts


class UnshareSandbox(Sandbox):
    name = "unshare"

    def __init__(self, *args, binary: str = "unshare", **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.binary = shutil.which(binary) or binary

    def command(self, directory: Path, inputs: dict[str, Path], spec: dict) -> list[str]:
        root = directory / "root"
        root.mkdir(mode=0o755)
        binds, links = system_mounts()
        size = self.limits.max_file_mb * 1024 * 1024
        spec = spec | {
            "root": str(root),
            "ro_binds": binds,
            "symlinks": links,
            "tmpfs": {WORKDIR: size, "/tmp": size},
            "files": {f"{WORKDIR}/{name}": str(path) for name, path in inputs.items()},
        }
        namespaces = [
            "--user",
            "--map-root-user",
            "--pid",
            "--net",
            "--mount",
            "--ipc",
            "--uts",
            "--fork",
            "--kill-child",
        ]
        return [self.binary, *namespaces, *self.launcher_argv(spec)]
