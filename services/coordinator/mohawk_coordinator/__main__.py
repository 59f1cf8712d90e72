"""`python -m mohawk_coordinator`: one coordinator replica."""

import argparse

from mohawk_coordinator.main import add_arguments, run

parser = argparse.ArgumentParser(prog="mohawk coordinator", description="Run one coordinator replica.")
add_arguments(parser)
raise SystemExit(run(parser.parse_args()))
