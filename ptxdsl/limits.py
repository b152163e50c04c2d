"""Hardware limits of the targets (Hopper, sm_90) that the builder, verifier, interpreter and
runtime check against."""

MAX_SMEM_BYTES = 232448  # dynamic shared memory per CTA (227 KiB)
MBARRIER_MAX_COUNT = (1 << 20) - 1  # arrival count and tx-count of one phase
PORTABLE_CLUSTER = 8  # CTAs per cluster on every sm_90 part; 16 needs the non-portable opt-in
MAX_CLUSTER = 16
