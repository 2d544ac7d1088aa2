// Host driver of kernels/prototypes/e8_prefix_gemv.cu under host_simt.h (see there).
// - As a program, built and run by `python py/benches/cuda_e8_prefix_prototype.py --host`:
//     e8_prefix_host DIR KERNEL WARPS_PER_BLOCK GRID
//   reads DIR/{meta,words,index,table,scales,x}.bin (meta: nwords rows cols rows_per_chunk chunks
//   segments seg_blocks M as int64; x: f32, or f16 bits for the _mma kernels) and writes DIR/y.bin
//   (M × rows f32, or rows × cols bf16 for the _decode kernels).
// - As a shared library (-shared -fPIC -DHC_EP_LIBRARY), `hc_ep_host_launch` runs one launch over
//   host memory: the script's `--dry-run` runs its GPU mode with it.
#include "host_simt.h"
#include "e8_prefix_gemv.cu"

#include <cstdio>
#include <string>

// The kernels by name (null for an unknown one).
static void (*hc_ep_kernel(const std::string& k))(E8PrefixArgs) {
    return k == "l8" ? hc_e8_prefix_l8 : k == "l10" ? hc_e8_prefix_l10 : k == "l12" ? hc_e8_prefix_l12
         : k == "l8c16" ? hc_e8_prefix_l8c16 : k == "l8c32" ? hc_e8_prefix_l8c32
         : k == "pairs11" ? hc_e8_prefix_pairs11 : k == "pairs12" ? hc_e8_prefix_pairs12
         : k == "r8_l8" ? hc_e8_prefix_r8_l8 : k == "r8_l8c32" ? hc_e8_prefix_r8_l8c32
         : k == "r8_pairs12" ? hc_e8_prefix_r8_pairs12 : k == "r8_l8_mma" ? hc_e8_prefix_r8_l8_mma
         : k == "r8_l8c32_mma" ? hc_e8_prefix_r8_l8c32_mma : k == "r8_pairs12_mma" ? hc_e8_prefix_r8_pairs12_mma
         : k == "r8_l8_decode" ? hc_e8_prefix_r8_l8_decode
         : k == "r8_pairs12_decode" ? hc_e8_prefix_r8_pairs12_decode
         : k == "r8_pairs11" ? hc_e8_prefix_r8_pairs11 : k == "r8_pairs11_d2" ? hc_e8_prefix_r8_pairs11_d2
         : k == "r8_pairs12_d2_mma" ? hc_e8_prefix_r8_pairs12_d2_mma : k == "r8_pairs12_d2_mma1" ? hc_e8_prefix_r8_pairs12_d2_mma1
         : k == "r8_pairs12_d2" ? hc_e8_prefix_r8_pairs12_d2 : k == "r8_pairs12_d2w8" ? hc_e8_prefix_r8_pairs12_d2w8
         : nullptr;
}

// For the driver's dry run (`--dry-run`, built with -shared -DHC_EP_LIBRARY): one launch of
// kernel `name` over the arguments' host memory; 0, or 4 for an unknown kernel.
extern "C" int hc_ep_host_launch(const char* name, const E8PrefixArgs* a, int warps, int grid) {
    void (*kern)(E8PrefixArgs) = hc_ep_kernel(name);
    if (!kern) return 4;
    const E8PrefixArgs args = *a;
    hc_host::launch(grid, 32 * warps, [&] { kern(args); });
    return 0;
}

#ifndef HC_EP_LIBRARY
template <class T>
static std::vector<T> read(const std::string& path) {
    std::vector<T> v;
    FILE* f = std::fopen(path.c_str(), "rb");
    if (!f) return v;
    T t;
    while (std::fread(&t, sizeof t, 1, f) == 1) v.push_back(t);
    std::fclose(f);
    return v;
}

int main(int argc, char** argv) {
    if (argc != 5) {
        std::fprintf(stderr, "usage: %s DIR KERNEL WARPS GRID\n", argv[0]);
        return 2;
    }
    const std::string d = argv[1];
    const std::string k = argv[2];
    const int warps = std::atoi(argv[3]), grid = std::atoi(argv[4]);
    auto meta = read<long long>(d + "/meta.bin");
    auto words = read<uint32_t>(d + "/words.bin");
    auto index = read<uint32_t>(d + "/index.bin");
    auto table = read<uint32_t>(d + "/table.bin");
    auto scales = read<float>(d + "/scales.bin");
    auto x = read<float>(d + "/x.bin");
    if (meta.size() != 8) return 3;
    // y: M × rows f32, or the decoded weights (rows × cols bf16) for the _decode kernels.
    const bool decode = k.size() > 7 && k.compare(k.size() - 7, 7, "_decode") == 0;
    std::vector<float> y(decode ? (meta[1] * meta[2] + 1) / 2 : meta[1] * meta[7], NAN);
    E8PrefixArgs a{words.data(), index.data(), table.data(), scales.data(), x.data(), y.data(), nullptr,
                   meta[0], (int)meta[1], (int)meta[2], (int)meta[3], (int)meta[4], (int)meta[5], (int)meta[6],
                   (int)meta[7]};
    if (hc_ep_host_launch(k.c_str(), &a, warps, grid) != 0) return 4;
    FILE* f = std::fopen((d + "/y.bin").c_str(), "wb");
    std::fwrite(y.data(), 1, decode ? 2 * meta[1] * meta[2] : 4 * y.size(), f);
    std::fclose(f);
    return 0;
}
#endif
