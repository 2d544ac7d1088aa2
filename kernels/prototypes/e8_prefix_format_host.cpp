// The committed kernels of kernels/e8_prefix.cu on the host, under host_simt.h (one thread a
// lane; votes, shuffles and mma.sync through barriers), as a shared library:
// `hc_e8p_host_launch` runs one launch of a named kernel over host memory. py/tests/
// test_e8_prefix_host.py builds it and checks the kernels on the streams the Rust encoder
// writes, without a GPU.
#include "host_simt.h"
#include "e8_prefix.cu"

#include <string>

#define HC_E8P_NAMES(NAME)                                                             \
    if (k == "hc_e8p_gemv_" #NAME) return hc_e8p_gemv_##NAME;                          \
    if (k == "hc_e8p_mma_" #NAME) return hc_e8p_mma_##NAME;                            \
    if (k == "hc_e8p_decode_bf16_" #NAME) return hc_e8p_decode_bf16_##NAME;            \
    if (k == "hc_e8p_decode_f16_" #NAME) return hc_e8p_decode_f16_##NAME;              \
    if (k == "hc_e8p_decode_f32_" #NAME) return hc_e8p_decode_f32_##NAME;

// The kernels by name (null for an unknown one).
static void (*hc_e8p_kernel(const std::string& k))(E8PrefixArgs) {
    HC_E8P_NAMES(l8)
    HC_E8P_NAMES(l10)
    HC_E8P_NAMES(l12)
    HC_E8P_NAMES(p11)
    HC_E8P_NAMES(p12)
    if (k == "hc_e8p_gemv2_p11") return hc_e8p_gemv2_p11;
    if (k == "hc_e8p_gemv2_p12") return hc_e8p_gemv2_p12;
    if (k == "hc_e8p_mma2_p11") return hc_e8p_mma2_p11;
    if (k == "hc_e8p_mma2_p12") return hc_e8p_mma2_p12;
    return nullptr;
}

// One launch of kernel `name` (`grid` blocks of `warps` warps) over the arguments' host memory;
// 0, or 4 for an unknown kernel, 5 for a block larger than the host's shared memory holds.
extern "C" int hc_e8p_host_launch(const char* name, const E8PrefixArgs* a, int warps, int grid) {
    void (*kern)(E8PrefixArgs) = hc_e8p_kernel(name);
    if (!kern) return 4;
    if (warps < 1 || warps > HC_EP_WARPS) return 5;
    const E8PrefixArgs args = *a;
    hc_host::launch(grid, 32 * warps, [&] { kern(args); });
    return 0;
}
