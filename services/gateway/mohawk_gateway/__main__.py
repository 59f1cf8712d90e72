"""`python -m mohawk_gateway`: the gateway process (the same as `mohawk gateway`)."""

from mohawk_gateway.main import main

try:
    raise SystemExit(main())
except KeyboardInterrupt:  # a second Ctrl-C during the drain
    raise SystemExit(130) from None
