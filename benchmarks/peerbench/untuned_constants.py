"""untuned.py's fixed settings: the hidden sizes' range, the modes, the peers and the checks."""

ELEMENTS = 2**26
LOW, HIGH = 256, 65536
ODD_FROM = 1000  # the summary holds odd sizes from here up to the bandwidth target
MODES = ("shipped", "no-shipped", "tuned")
UNTUNED = "shipped"
PEER_NAMES = ("eager", "compile", "liger")
DTYPES = ("bf16", "fp16", "fp32")
SMALL_ROWS = (1, 64, 256)  # decode batches; --small-rows 1,16,64,256 adds one
EPS = 1e-5
OFFSET_MEAN, OFFSET_SPREAD, OFFSET_TOL = 1000.0, 0.1, 1e-6
GRAPH_REP_MS = 5  # each replay still averages hundreds of launches of a few microseconds
# The residue classes the odd sizes cycle through, hardest first: an odd hidden size starts
# 16-bit rows on 2-byte boundaries; 4 mod 8 and 2 mod 4 on 8- and 4-byte ones.
ODD_KINDS = ((2, 1), (8, 4), (4, 2))
