"""`python -m mohawk_shard`: one shard node."""

import os
import sys

# oneDNN (torch's bf16 matmuls on CPUs with AVX512-BF16 or AMX) keeps a compiled kernel, with its
# own scratch memory, for every matmul shape it meets, up to 1,024 of them by default: under
# traffic of many prompt lengths that held ~400 MiB after the 1,000-session load test had ended.
# A small cache bounds it (set before torch loads; an operator's own setting wins).
os.environ.setdefault("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "32")

from mohawk_shard.node.main import main

sys.exit(main())
