"""``run_docstore``: the demo document store (``docstore.server``) as a management command."""

from __future__ import annotations

import argparse

from django.core.management.base import BaseCommand, CommandParser

from docstore.server import build_parser, serve


class Command(BaseCommand):
    help = "Run the demo document store on loopback (same flags as `python -m docstore`)."

    def add_arguments(self, parser: CommandParser) -> None:
        for action in build_parser()._actions:
            if action.dest != "help":
                parser.add_argument(
                    *action.option_strings, dest=action.dest, type=action.type, default=action.default, help=action.help
                )

    def handle(self, *args: object, **options: object) -> None:
        dests = [action.dest for action in build_parser()._actions if action.dest != "help"]
        serve(argparse.Namespace(**{dest: options[dest] for dest in dests}))
