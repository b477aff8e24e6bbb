"""Paths named relative to the project: every run works in the project folder (the CLI moves there first), so
a folder inside it is recorded by its name relative to it, and a project moved or copied whole still finds
what its records name."""

from pathlib import Path


def project_relative(path: str | Path) -> str | None:
    """``path`` relative to the working folder (the project's) as a POSIX name when it lies inside it, else
    None. Symbolic links and ``..`` are resolved first, so two names of one folder give one answer."""
    here, full = Path.cwd().resolve(), Path(path).expanduser().resolve()
    return full.relative_to(here).as_posix() if full.is_relative_to(here) else None


def project_name(path: str | Path) -> str:
    """How records name ``path``: relative to the project when inside it, else its absolute name."""
    relative = project_relative(path)
    return relative if relative is not None else str(Path(path).expanduser().resolve())
