/* Whether the native kernels built for this host run bf16 weights on AMX tiles (amx_gemm.h): built with the same
 * flags as the kernels, so it takes the same path they take. */
#include "amx_gemm.h"

int hd_bf16_tiles(void) {
#ifdef AG_AMX
    return ag_ready();
#else
    return 0;
#endif
}
