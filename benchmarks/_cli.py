"""The benchmarks' command lines: ``--help`` prints the script's docstring (what it measures,
how to run it) instead of starting a run that takes minutes."""

from __future__ import annotations

import argparse


def parser(doc: str | None) -> argparse.ArgumentParser:
    """An argument parser whose help is ``doc``: its first paragraph as the description, the
    rest as the epilogue, line breaks kept."""
    head, _, rest = (doc or "").partition("\n\n")
    return argparse.ArgumentParser(description=head, epilog=rest or None,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
