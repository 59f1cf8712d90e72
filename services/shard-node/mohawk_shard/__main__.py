"""`python -m mohawk_shard`: one shard node."""

import sys

from mohawk_shard.node.main import main

sys.exit(main())
