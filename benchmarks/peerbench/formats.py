"""Number formatting shared by the progress lines, the tables and the summary."""


def format_or_dash(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:g} MiB"
