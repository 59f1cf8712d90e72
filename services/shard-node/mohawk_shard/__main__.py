"""`python -m mohawk_shard`: one shard node."""

import os
import sys

from mohawk_shard.native_caches import bound_native_caches

bound_native_caches(os.environ)  # before torch loads: it reads them once

from mohawk_shard.node.main import main  # noqa: E402

sys.exit(main())
