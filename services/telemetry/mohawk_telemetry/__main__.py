"""`python -m mohawk_telemetry`: the telemetry service."""

import argparse
import sys

from mohawk_telemetry.main import add_arguments, run

parser = argparse.ArgumentParser(prog="mohawk_telemetry", description="the cluster's metrics and dashboard")
add_arguments(parser)
sys.exit(run(parser.parse_args()))
