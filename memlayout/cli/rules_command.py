"""`memlayout rules` and `memlayout explain`: the rule registry, for people."""

# Annotations evaluated at import, for typer (see memlayout.cli.app).

from typing import Annotated

import typer

from memlayout.errors import UsageError
from memlayout.output.writer import write_output


def rules_command() -> None:
    """List every rule: code, name, default severity and when it fires."""
    from memlayout.rules import RULES

    width = max(len(r.name) for r in RULES.values())
    lines = (f"{code}  {rule.name:<{width}}  {rule.severity.value:<7}  {rule.summary}\n"
             for code, rule in sorted(RULES.items()))
    write_output(lines, None)


def explain_command(code: Annotated[str, typer.Argument(help="A rule code such as ML102, or its name.")]) -> None:
    """Explain one rule: what it detects, why it matters, an example, and how to fix it."""
    from memlayout.rules import RULES

    wanted = code.strip()
    rule = RULES.get(wanted.upper()) or next((r for r in RULES.values() if r.name == wanted.lower()), None)
    if rule is None:
        raise UsageError(f"no rule {code!r}", "`memlayout rules` lists them")
    from memlayout.report.rule_docs import explain_text

    write_output(explain_text(rule), None)
