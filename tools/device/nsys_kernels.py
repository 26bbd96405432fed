# What the device scripts share about kernels: their kind by name, and the kernels of nsys's SQLite export.
import sqlite3


def kind(n):
    """The kind of a kernel, by its name (quantized matmul, attention, ...)."""
    n = n.lower()
    if 'flash_attn' in n or 'fattn' in n: return 'attention'
    if 'mul_mat_q' in n or 'mmq' in n: return 'matmul (MMQ)'
    if 'gemm' in n or 'cublas' in n or 'nvjet' in n or 'xmma' in n: return 'matmul (cuBLAS)'
    if 'mul_mat_vec' in n or 'mmv' in n: return 'matvec'
    if 'quantize' in n: return 'quantize activations'
    if 'get_rows' in n: return 'get_rows'
    if 'norm' in n: return 'norm'
    if 'rope' in n: return 'rope'
    if 'convert' in n or 'cpy' in n: return 'copy/convert'
    return 'elementwise/other'


def kernel_rows(path):
    """(start ns, end ns, CUDA stream, name) of every kernel in nsys's SQLite export at `path`, in launch order."""
    return sqlite3.connect(path).execute('select k.start, k.end, k.streamId, s.value from CUPTI_ACTIVITY_KIND_KERNEL k '
                                         'join StringIds s on k.demangledName = s.id order by k.start').fetchall()
