"""How the ``autonorm`` command line reports trouble: one line on stderr, never a traceback.

:class:`MessageGroup` is the command group: a bad option, an error autonorm raises on purpose,
a file that cannot be written or an interrupt each end the command with one ``error: ...`` line
and a non-zero status (2 for a usage error, 130 for an interrupt, 1 otherwise). Warnings shown
while a command runs (a corrupt database set aside, an untuned default exported, a read-only
database) are ``warning: ...`` lines, without the Python source line that ``warnings`` adds.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Iterator
from typing import Any, NoReturn

import click

from autonorm.errors import AutonormError

# Exit status of a command stopped by Ctrl-C (128 + SIGINT), as shells report it.
INTERRUPTED = 130

# What click raises for a group run without a command (click 8.2 on; its message is the help).
_NO_ARGS: tuple[type[Exception], ...] = tuple(
    t for t in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if t is not None
)


class MessageGroup(click.Group):
    """A click group whose commands end in one line on any error (see the module docstring)."""

    def main(self, args: Any = None, prog_name: str | None = None,  # noqa: D102
             complete_var: str | None = None, standalone_mode: bool = True,
             **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            with warnings_as_lines():
                status = super().main(args, prog_name, complete_var, False, **extra)
        except _NO_ARGS as exc:
            # A command given no arguments at all: its help, as click shows it, is the answer.
            click.echo(exc.format_message(), err=True)
            sys.exit(exc.exit_code)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} --help')" if exc.ctx is not None else ""
            fail(exc.format_message() + hint, exc.exit_code)
        except click.ClickException as exc:
            fail(exc.format_message(), exc.exit_code)
        except click.Abort as exc:
            interrupted = isinstance(exc.__cause__ or exc.__context__, KeyboardInterrupt)
            fail("interrupted" if interrupted else "aborted", INTERRUPTED if interrupted else 1)
        except KeyboardInterrupt:
            fail("interrupted", INTERRUPTED)
        except AutonormError as exc:
            fail(str(exc), 1)
        except OSError as exc:
            # A file system refusal autonorm did not foresee (a full disk, a vanished directory).
            where = f" {exc.filename}" if exc.filename else ""
            fail(f"cannot use{where}: {exc.strerror or exc}", 1)
        sys.exit(status if isinstance(status, int) else 0)


def fail(message: str, status: int) -> NoReturn:
    """Print ``error: <message>`` as one line on stderr and exit with ``status``."""
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(status)


def one_line(text: str) -> str:
    """Return ``text`` with its lines joined by spaces (a message is one line)."""
    return " ".join(part.strip() for part in str(text).splitlines() if part.strip())


@contextlib.contextmanager
def warnings_as_lines() -> Iterator[None]:
    """Show every warning raised inside as a ``warning: <message>`` line on stderr."""

    def show(message: Warning | str, category: type[Warning], filename: str, lineno: int,
             file: Any = None, line: str | None = None) -> None:
        click.echo(f"warning: {one_line(str(message))}", err=True)

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
