//! What the host and the kernels share, without CUDA: kernel names and indices, the launch
//! shapes, and the kernels' argument structs (`#[repr(C)]`, field for field as in
//! `kernels/gemv.cu`).

use crate::{AffineGemv, E8Gemv};

/// A PTX module's text, whether it is required, and the compute capability it alone loads on.
pub(crate) type PtxModule = (&'static str, bool, Option<(i32, i32)>);

/// The PTX modules built from `kernels/*.cu` by `cargo xtask ptx`: each one's text, whether the
/// kernels cannot load without it, and the compute capability it is built for where it loads on
/// that one only (`*_sm90a.cu`: 9.0); a function is looked up in each in turn. A module that is
/// not required and fails to load (its JIT refused by a driver) leaves its kernels missing, each
/// launch of one an error naming the failed load, and the other modules' kernels running. A
/// module for another compute capability is not tried.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) const PTX: [PtxModule; 4] = [
    (include_str!("../ptx/gemv.ptx"), true, None),
    (include_str!("../ptx/trellis_encode.ptx"), true, None),
    (include_str!("../ptx/e8_prefix.ptx"), false, None),
    // The Hopper GEMM; loaded only where its route is on (`Kernels::new`).
    (include_str!("../ptx/gemm_sm90a.ptx"), false, Some((9, 0))),
];

/// The kernels a PTX module declares (`.entry NAME(`).
fn declared(text: &str) -> impl Iterator<Item = &str> {
    text.split(".entry ")
        .skip(1)
        .filter_map(|rest| rest.split_once('(').map(|(name, _)| name.trim()))
}

/// The module each kernel of `names` is in: its index in [`PTX`], the first module that
/// declares it. A kernel no module declares is an error (a PTX out of step with the host).
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn kernel_modules(names: &[String]) -> std::result::Result<Vec<usize>, String> {
    let mut by_name = std::collections::HashMap::new();
    for (i, (text, _, _)) in PTX.iter().enumerate() {
        for name in declared(text) {
            by_name.entry(name).or_insert(i);
        }
    }
    names
        .iter()
        .map(|n| by_name.get(n.as_str()).copied().ok_or_else(|| n.clone()))
        .collect()
}

/// Kernel names: the fixed ones, then the affine GEMVs by (bits, batch tile), then the E8
/// GEMVs by (bits, pass of 1, 2 or 4 rows), the trellis GEMVs, the tensor-core kernels, the
/// trellis group kernels and encoders, the cp.async kernels, the tensor-core GEMMs, then the
/// pair code's trellis group kernels, the trellis tensor-core kernels, the pair encoders,
/// `hc_quant_f8`, `hc_quant_f8_blocks`, the grouped cp.async kernels, the prefix-coded E8
/// kernels, the half-step cp.async kernels, the Hopper GEMMs and, last, the aligned affine GEMVs and decoders of 1, 3, 5, 6 and 7 bits; indices from [`affine_gemv`],
/// [`e8_gemv`], [`trellis_gemv`], [`affine_mma`], [`affine_cpa`], [`affine_gemm`],
/// [`trellis_groups`], [`trellis_decode_groups`], [`trellis_mma`], [`e8_prefix`],
/// [`e8_prefix_two`], [`affine_cpa_halves`], [`wgmma`] and [`affine_decode_chunks`].
pub(crate) fn function_names() -> Vec<String> {
    let mut v: Vec<String> = [
        "hc_rht",
        "hc_affine_decode",
        "hc_e8_decode",
        "hc_e8_halves",
        "hc_affine_gemv_generic",
        "hc_e8_gemv_any",
        "hc_rht_fast",
        "hc_affine_decode_b2",
        "hc_affine_decode_b4",
        "hc_affine_decode_b8",
        "hc_trellis_decode",
        "hc_kv_e8_encode",
        "hc_kv_e8_decode",
        "hc_e8_rans_decode",
        "hc_e8_rans_gemv_m1",
        "hc_e8_rans_gemv_m2",
        "hc_e8_rans_gemv_m3",
        "hc_e8_rans_gemv_m4",
        "hc_quant_i8",
        "hc_w8a8_out",
        "hc_kv_e8_attend",
        "hc_kv_attend_merge",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for b in [2, 4, 8] {
        for m in BATCH_TILES {
            v.push(format!("hc_affine_gemv_b{b}_m{m}"));
        }
    }
    for b in 2..=8 {
        for m in E8_PASSES {
            v.push(format!("hc_e8_gemv_b{b}_m{m}"));
        }
    }
    for m in BATCH_TILES {
        for k in TRELLIS_KS {
            v.push(format!("hc_trellis_gemv_m{m}_k{k}"));
        }
    }
    for (b, t) in MMA_KINDS {
        for n in 1..=2 {
            for w in MMA_WORDS {
                v.push(format!("hc_affine_mma_b{b}_w{w}_n{n}_{t}"));
            }
        }
    }
    for m in TRELLIS_GROUP_TILES {
        for k in 1..=4 {
            v.push(format!("hc_trellis_groups_m{m}_k{k}"));
        }
    }
    for k in 1..=4 {
        v.push(format!("hc_trellis_decode_groups_k{k}"));
    }
    // kernels/trellis_encode.cu
    for k in 1..=4 {
        v.push(format!("hc_trellis_encode_k{k}"));
    }
    for (b, t) in CPA_KINDS {
        v.push(format!("hc_affine_cpa_b{b}_{t}"));
    }
    for (b, t) in CPA_KINDS {
        for (r, n, _) in GEMM_SHAPES {
            v.push(format!("hc_affine_gemm_b{b}_r{r}_n{n}_{t}"));
        }
    }
    for m in TRELLIS_GROUP_TILES {
        for k in 1..=4 {
            v.push(format!("hc_trellis_groups_m{m}_k{k}_v2"));
        }
    }
    for k in 1..=4 {
        v.push(format!("hc_trellis_decode_groups_k{k}_v2"));
    }
    for code in 1..=2 {
        for n in 1..=2 {
            for k in 1..=4 {
                v.push(format!("hc_trellis_mma_k{k}_v{code}_n{n}"));
            }
        }
    }
    for k in 1..=PAIR_ENCODE_KS {
        v.push(format!("hc_trellis_encode_k{k}_v2"));
    }
    v.push("hc_quant_f8".into());
    v.push("hc_quant_f8_blocks".into());
    for (b, t) in CPA_KINDS {
        v.push(format!("hc_affine_cpa_group_b{b}_{t}"));
    }
    // kernels/e8_prefix.cu
    for f in E8P_FORMS {
        for k in E8P_KINDS {
            v.push(format!("hc_e8p_{k}_{}", f.0));
        }
    }
    for (name, _) in E8P_TWO_FORMS {
        v.push(format!("hc_e8p_gemv2_{name}"));
        v.push(format!("hc_e8p_mma2_{name}"));
    }
    // kernels/gemv.cu again
    for t in CPA_HALVES_TYPES {
        v.push(format!("hc_affine_cpa_halves_b4_{t}"));
    }
    // kernels/gemm_sm90a.cu (loaded on compute capability 9.0 only)
    for t in CPA_HALVES_TYPES {
        for (s, n, k, ks) in WGMMA_SHAPES {
            let x = if ks > 1 {
                format!("_x{ks}")
            } else {
                String::new()
            };
            v.push(format!("hc_wgmma_b4_s{s}_n{n}_k{k}{x}_{t}"));
        }
    }
    // kernels/gemv.cu: the aligned affine GEMVs and decoders of the other widths
    for b in ODD_BITS {
        for m in BATCH_TILES {
            v.push(format!("hc_affine_gemv_b{b}_m{m}"));
        }
    }
    for b in ODD_BITS {
        v.push(format!("hc_affine_decode_b{b}"));
    }
    // kernels/gemm_sm90a.cu: the tensor-core GEMM split over clusters
    for (b, t) in CPA_KINDS {
        for (n, ks) in GEMM_SPLITS {
            v.push(format!("hc_affine_gemm_b{b}_r1_n{n}_x{ks}_{t}"));
        }
    }
    v
}

/// The code widths whose aligned affine kernels come after the Hopper GEMMs in the table
/// ([`affine_gemv`], [`affine_decode_chunks`]): codes that straddle 32-bit words, and 1 bit.
const ODD_BITS: [usize; 5] = [1, 3, 5, 6, 7];

/// The first of the kernels after the Hopper GEMMs.
fn after_wgmma() -> usize {
    wgmma(crate::Dtype::F16, WGMMA_SHAPES.len() - 1).expect("the Hopper GEMMs are in the table") + 1
}

/// The Hopper GEMM's compiled shapes (`kernels/gemm_sm90a.cu`,
/// `hc_wgmma_b4_s{S}_n{BN}_k{BK}[_x{KS}]_{bf16,f16}`): stages, activation rows a block, columns
/// a chunk, and blocks a cluster splitting the columns (1: no cluster); [`wgmma_shape`] picks
/// one. (Five stages at 128 activation rows, four at 256, and clusters of 4 were timed too and
/// ran slower: `docs/eval/cuda_gemm.md`.)
pub(crate) const WGMMA_SHAPES: [(usize, usize, usize, usize); 6] = [
    (4, 128, 128, 1),
    (6, 128, 64, 1),
    (5, 256, 64, 1),
    (4, 128, 128, 2),
    (6, 128, 64, 2),
    (5, 256, 64, 2),
];
/// The Hopper GEMM's shapes unsplit and split in 2: blocks of 128 activation rows in chunks of
/// 128 columns, of 64, and blocks of 256 rows.
const WGMMA_N128_K128: [usize; 2] = [0, 3];
const WGMMA_N128_K64: [usize; 2] = [1, 4];
const WGMMA_N256: [usize; 2] = [2, 5];
/// The most activation rows for which the routes prefer the Hopper GEMM to decode + cuBLAS in
/// any of its shapes ([`wgmma_route`]).
pub(crate) const WGMMA_ROUTE_ANY: usize = 256;
/// The most activation rows for which the routes prefer the Hopper GEMM to decode + cuBLAS
/// ([`wgmma_route`]): every batch up to [`WGMMA_ROUTE_ANY`], above that only batches whose last
/// block of 256 rows is nearly full (at most [`WGMMA_TAIL_EMPTY`] rows of it empty). On an H100, with the
/// activations read by the tensor memory accelerator, its blocks of 256 rows ran 0.60–0.73× bf16
/// at 512 rows against decode + cuBLAS's 0.56–0.61×, and 0.67–0.72× against 0.56–0.57× at 448,
/// but on 28672×8192 0.37× / 0.47× at 320 / 384 rows against 0.48× / 0.51× (the second block of
/// 256 rows a quarter or half full), and level or behind at 1024 (`docs/eval/cuda_gemm.md`).
pub(crate) const WGMMA_ROUTE_MAX: usize = 512;
/// Above 256 activation rows, the most rows of the last block of 256 that may be empty for the
/// routes to prefer the Hopper GEMM ([`WGMMA_ROUTE_MAX`]): 448–512 rows.
pub(crate) const WGMMA_TAIL_EMPTY: usize = 64;
/// The most blocks a launch grid's y dimension holds.
pub(crate) const MAX_GRID_Y: usize = 65_535;

/// Weight rows a block of the Hopper GEMM (`WG_BM`) and its threads (`WG_THREADS`).
pub(crate) const WGMMA_ROWS: usize = 128;
pub(crate) const WGMMA_THREADS: u32 = 256;

/// The Hopper GEMM of shape `shape` (an index of [`WGMMA_SHAPES`]) under bf16 or f16
/// activations.
pub(crate) fn wgmma(dtype: crate::Dtype, shape: usize) -> Option<usize> {
    let kind = match dtype {
        crate::Dtype::Bf16 => 0,
        crate::Dtype::F16 => 1,
        crate::Dtype::F32 => return None,
    };
    (shape < WGMMA_SHAPES.len())
        .then(|| affine_cpa_halves(4, crate::Dtype::F16))
        .flatten()
        .map(|last| last + 1 + kind * WGMMA_SHAPES.len() + shape)
}

/// Dynamic shared memory of the Hopper GEMM of shape `shape`: its stages (`WgStage`: `BN`
/// activation rows of `2·BK` bytes, then 128 rows of codes `BK/2 + 16` bytes apart; split, they
/// hold the partial sums after the main loop, at their start) and 1024 bytes to align them to
/// the swizzle's period.
pub(crate) fn wgmma_shared(shape: usize) -> u32 {
    let (s, n, k, _) = WGMMA_SHAPES[shape];
    (s * (n * k * 2 + WGMMA_ROWS * (k / 2 + 16)) + 1024) as u32
}

/// The blocks the Hopper GEMM of shape `shape` launches on `rows` weight rows and `batch`
/// activation rows: one per 128 rows, `BN` activation rows and split of the columns.
pub(crate) fn wgmma_blocks(rows: usize, batch: usize, shape: usize) -> usize {
    let (_, n, _, ks) = WGMMA_SHAPES[shape];
    rows.div_ceil(WGMMA_ROWS) * ks * batch.div_ceil(n)
}

/// Whether the Hopper GEMM of shape `shape` on `rows` weight rows and `batch` activation rows
/// launches blocks enough ([`wgmma_blocks`]) to fill three quarters of a device of `sms`
/// multiprocessors (one block each: its stages take most of the shared memory).
pub(crate) fn wgmma_fills(rows: usize, batch: usize, shape: usize, sms: u32) -> bool {
    4 * wgmma_blocks(rows, batch, shape) >= 3 * sms as usize
}

/// The Hopper GEMM's shape for a layer of `rows` × `cols` whose groups hold `group_len` columns
/// (a multiple of 64) at `batch` activation rows on a device of `sms` multiprocessors: blocks of
/// 256 activation rows above 128 (a block then decodes each weight for twice the rows: 1.5–1.8×
/// the throughput of 128 on an H100), else of 128 in chunks of 128 columns where the groups hold
/// whole ones, else of 64; each unsplit where that fills the device ([`wgmma_fills`]), else
/// split over a cluster of 2 blocks where that does (each taking at least 2 chunks). Where none
/// fills, the most blocks.
pub(crate) fn wgmma_shape(
    group_len: usize,
    rows: usize,
    cols: usize,
    batch: usize,
    sms: u32,
) -> usize {
    let narrow = if group_len.is_multiple_of(128) {
        WGMMA_N128_K128
    } else {
        WGMMA_N128_K64
    };
    let wide = if batch > 128 { &WGMMA_N256[..] } else { &[] };
    let whole = |&s: &usize| {
        let (_, _, k, ks) = WGMMA_SHAPES[s];
        ks == 1 || 2 * ks <= cols / k
    };
    let fits = wide.iter().chain(&narrow).filter(|s| whole(s));
    fits.clone()
        .find(|&&s| wgmma_fills(rows, batch, s, sms))
        .or_else(|| fits.max_by_key(|&&s| wgmma_blocks(rows, batch, s)))
        .copied()
        .unwrap_or(narrow[0])
}

/// Whether the routes should prefer the Hopper GEMM ([`wgmma_shape`]) to decode + cuBLAS for this
/// layer at `batch` activation rows: its grid filling the device, at up to 256 rows any shape,
/// above that blocks of 256 rows the last of which is nearly full ([`WGMMA_ROUTE_MAX`],
/// [`WGMMA_TAIL_EMPTY`]). Where the grid did not fill it ran slower than decode + cuBLAS on an
/// H100 (`docs/eval/cuda_gemm.md`: 8192² at 128 rows unsplit, 64 blocks: 0.37× bf16 against
/// 0.40×). Blocks of 128 activation rows above 128 (each weight decoded once for each block of
/// rows: 4096-row layers split in 2) ran 0.66–0.71× against 0.47–0.56× at 192 and 256 rows once
/// the activations came by the tensor memory accelerator (before the scale loads moved ahead
/// they ran level with it, and the route left them out); above 256 rows only blocks of 256 were
/// timed.
pub(crate) fn wgmma_route(
    group_len: usize,
    rows: usize,
    cols: usize,
    batch: usize,
    sms: u32,
) -> bool {
    let shape = wgmma_shape(group_len, rows, cols, batch, sms);
    let (_, n, _, _) = WGMMA_SHAPES[shape];
    let rows_ok = batch <= WGMMA_ROUTE_ANY
        || (batch <= WGMMA_ROUTE_MAX
            && n == 256
            && batch.next_multiple_of(n) - batch <= WGMMA_TAIL_EMPTY);
    rows_ok && wgmma_fills(rows, batch, shape, sms)
}

/// The prefix-coded E8 kernels' forms: (name, single code limit, pair code limit).
pub(crate) const E8P_FORMS: [(&str, u8, u8); 5] = [
    ("l8", 8, 0),
    ("l10", 10, 0),
    ("l12", 12, 0),
    ("p11", 8, 11),
    ("p12", 8, 12),
];
/// Their kernels, in this order for each form.
const E8P_KINDS: [&str; 5] = ["gemv", "mma", "decode_bf16", "decode_f16", "decode_f32"];
/// The GEMV (FFMA, one activation row) of a prefix form.
pub(crate) const E8P_GEMV: usize = 0;
/// Its tensor-core form (1–16 rows, f16 activations).
pub(crate) const E8P_MMA: usize = 1;
/// Its bf16 decoder (`E8P_DECODE_BF16 + 1`: f16, `+ 2`: f32).
pub(crate) const E8P_DECODE_BF16: usize = 2;

/// Kernel `kind` (`E8P_GEMV`, `E8P_MMA`, `E8P_DECODE_BF16` or the f16 and f32 decoders after it) of
/// the prefix form with these limits, if compiled (`hc_e8p_{kind}_{form}`, after
/// [`affine_cpa_group`]'s kernels).
pub(crate) fn e8_prefix(limit: u8, pair_limit: u8, kind: usize) -> Option<usize> {
    let form = E8P_FORMS
        .iter()
        .position(|&(_, l, p)| (l, p) == (limit, pair_limit))?;
    let base = quant_f8_blocks() + 1 + CPA_KINDS.len();
    Some(base + E8P_KINDS.len() * form + kind)
}

/// The pair forms whose GEMV and tensor-core kernels also come in two chunks a warp
/// (`hc_e8p_gemv2_*`, `hc_e8p_mma2_*`, after the other prefix kernels): (name, pair code limit).
const E8P_TWO_FORMS: [(&str, u8); 2] = [("p11", 11), ("p12", 12)];

/// The two-chunks-a-warp kernel of the pair form of `pair_limit`, if compiled: the GEMV
/// (`mma` false) or the tensor cores'.
pub(crate) fn e8_prefix_two(pair_limit: u8, mma: bool) -> Option<usize> {
    let form = E8P_TWO_FORMS.iter().position(|&(_, p)| p == pair_limit)?;
    Some(e8_prefix(8, 12, E8P_KINDS.len() - 1)? + 1 + 2 * form + usize::from(mma))
}

/// The tensor-core GEMM's (row tiles per warp, batch tiles of 8, stages) shapes, in the order
/// of the names (`HC_GEMM_RN`); its (bits, activation type) are [`CPA_KINDS`].
const GEMM_SHAPES: [(usize, usize, usize); 4] = [(1, 4, 4), (1, 8, 4), (2, 4, 3), (2, 8, 3)];
/// Warps per block of the tensor-core GEMM (`HC_GEMM_WARPS`).
pub(crate) const GEMM_WARPS: u32 = 4;

/// The split tensor-core GEMM's (batch tiles of 8, blocks a cluster) forms, one row tile a warp
/// (`kernels/gemm_sm90a.cu`, `hc_affine_gemm_b{bits}_r1_n{nt}_x{ks}_{dtype}`, loaded on compute
/// capability 9.0 only), in the order of the names; its (bits, activation type) are
/// [`CPA_KINDS`]. `(2, 1)` is two batch tiles unsplit (the sm_80 GEMM has four or eight).
pub(crate) const GEMM_SPLITS: [(usize, usize); 10] = [
    (2, 1),
    (2, 2),
    (2, 4),
    (2, 8),
    (4, 2),
    (4, 4),
    (4, 8),
    (8, 2),
    (8, 4),
    (8, 8),
];

/// The tensor-core GEMM of `nt` batch tiles split over clusters of `ks` blocks (one row tile a
/// warp), if compiled: [`GEMM_SPLITS`].
pub(crate) fn affine_gemm_split(
    bits: usize,
    dtype: crate::Dtype,
    nt: usize,
    ks: usize,
) -> Option<usize> {
    let kind = affine_cpa(bits, dtype)? - affine_cpa(2, crate::Dtype::Bf16)?;
    let form = GEMM_SPLITS.iter().position(|&f| f == (nt, ks))?;
    Some(after_wgmma() + ODD_BITS.len() * (BATCH_TILES.len() + 1) + GEMM_SPLITS.len() * kind + form)
}

/// The tensor-core GEMM (`hc_affine_gemm_b{bits}_r{r}_n{nt}_{dtype}`) of 2- or 4-bit codes
/// under bf16 or f16 activations, if compiled for that shape.
pub(crate) fn affine_gemm(bits: usize, dtype: crate::Dtype, r: usize, nt: usize) -> Option<usize> {
    let kind = affine_cpa(bits, dtype)? - affine_cpa(2, crate::Dtype::Bf16)?;
    let shape = GEMM_SHAPES
        .iter()
        .position(|&(a, b, _)| (a, b) == (r, nt))?;
    Some(trellis_encode(4, 1) + 1 + CPA_KINDS.len() + GEMM_SHAPES.len() * kind + shape)
}

/// Weight rows one block of the GEMM computes with `r` row tiles of 16 per warp.
pub(crate) fn gemm_rows_per_block(r: usize) -> usize {
    GEMM_WARPS as usize * 16 * r
}

/// Dynamic shared memory of the GEMM of `bits`-bit codes with `r` row tiles per warp and `nt`
/// batch tiles: its stages, each `8·nt` activation rows of 256 bytes (a chunk of 128 16-bit
/// values), the block's `64·r` rows of codes (`16·bits` bytes each) and 128 bytes of scale
/// and offset pairs per tile of 16 rows.
pub(crate) fn affine_gemm_shared(bits: usize, r: usize, nt: usize) -> u32 {
    let stages = GEMM_SHAPES
        .iter()
        .find(|&&(a, b, _)| (a, b) == (r, nt))
        .map_or(0, |s| s.2);
    let rows = gemm_rows_per_block(r);
    (stages * (8 * nt * 256 + rows * 16 * bits + rows / 16 * 128)) as u32
}

/// Dynamic shared memory of the split GEMM of `bits`-bit codes and `nt` batch tiles (one row
/// tile a warp, 4 stages: `kernels/gemm_sm90a.cu`). Its partial sums reuse the stages.
pub(crate) fn affine_gemm_split_shared(bits: usize, nt: usize) -> u32 {
    let rows = gemm_rows_per_block(1);
    (4 * (8 * nt * 256 + rows * 16 * bits + rows / 16 * 128)) as u32
}

/// Blocks the split GEMM aims for on each multiprocessor ([`gemm_split`]).
const SPLIT_BLOCKS_PER_SM: usize = 2;
/// The fewest chunks of [`crate::GEMM_CHUNK`] columns a block of the split GEMM walks.
const SPLIT_MIN_CHUNKS: usize = 4;

/// The split GEMM's batch tiles of 8 (2, 4 or 8: the fewest that hold the batch, else 8) and
/// blocks a cluster (1, 2, 4 or 8) for a layer of `rows` × `cols` at `batch` activation rows
/// on `sms` multiprocessors, as long as each block walks [`SPLIT_MIN_CHUNKS`] chunks or more:
/// with 2 or 4 batch tiles, the fewest blocks a cluster that make three quarters of
/// [`SPLIT_BLOCKS_PER_SM`] blocks an SM; with 8 (128 registers a thread, and twice the partial
/// sums to add), the most that keep to one block an SM. Measured on an H100
/// (`py/benches/cuda_gemm_rows.py`, 4096 columns, every cluster size forced): at 17–32 rows
/// 1024 and 2048 rows ran fastest at 8 a cluster and 4096 at 2–4; at 64 rows 1024, 2048 and
/// 4096 rows ran fastest at 8, 4 and 2, 128 blocks each, where 1.5 an SM took 1.2–1.3× longer.
pub(crate) fn gemm_split(rows: usize, cols: usize, batch: usize, sms: u32) -> (usize, usize) {
    let nt = [2, 4, 8].into_iter().find(|&n| 8 * n >= batch).unwrap_or(8);
    let blocks = rows.div_ceil(gemm_rows_per_block(1)) * batch.div_ceil(8 * nt);
    let chunks = cols / crate::GEMM_CHUNK;
    let sms = sms as usize;
    let room = |ks: usize| {
        if nt == 8 {
            blocks * 2 * ks <= sms
        } else {
            4 * blocks * ks < 3 * SPLIT_BLOCKS_PER_SM * sms
        }
    };
    let mut ks = 1;
    while ks < 8 && room(ks) && chunks >= 2 * ks * SPLIT_MIN_CHUNKS {
        ks *= 2;
    }
    (nt, ks)
}

/// Whether the split GEMM (`ks` blocks a cluster, from [`gemm_split`]) runs a batch of 9–16
/// rows of a layer of `rows` rows faster than the tensor-core GEMV: where the layer is too short
/// for that GEMV to fill the device, a cluster of 8 (which needs 32 chunks: 4096 columns or
/// more) for each 64 rows making no more than a block an SM (up to 1024 rows on 132 SMs).
/// Measured on an H100 at 9 and 16 rows of 4096 columns, 8 a cluster: 1024 rows 7.3 µs against
/// the GEMV's 8.6–8.9 (bf16 8.2–8.8); 4096 rows 11.2–11.8 against 10.2–10.5, and 14 336 rows
/// 27.6–28.4 against 23.3–24.9.
pub(crate) fn split_beats_gemv(rows: usize, ks: usize, sms: u32) -> bool {
    ks == 8 && rows.div_ceil(gemm_rows_per_block(1)) * ks <= sms as usize
}

/// Blocks the GEMM's shape choice aims for (about 1.5 per SM of an H200, whose 132 SMs hold
/// two blocks of these sizes each).
const GEMM_BLOCKS: usize = 200;

/// The GEMM's shape for a weight of `rows` rows and `batch` activation rows: batch tiles of
/// 8·4 up to 32 rows, else of 8·8 if that still makes [`GEMM_BLOCKS`] blocks; two row tiles
/// per warp where that does, else one. Measured on an H200 (`py/benches/cuda_gemm.py`).
pub(crate) fn gemm_shape(rows: usize, batch: usize) -> (usize, usize) {
    let blocks =
        |r: usize, nt: usize| rows.div_ceil(gemm_rows_per_block(r)) * batch.div_ceil(8 * nt);
    let order: &[(usize, usize)] = if batch <= 32 {
        &[(2, 4), (1, 4)]
    } else {
        &[(2, 8), (1, 8), (2, 4), (1, 4)]
    };
    order
        .iter()
        .copied()
        .find(|&(r, nt)| blocks(r, nt) >= GEMM_BLOCKS)
        .unwrap_or((1, 4))
}

/// The batch-1 cp.async affine kernels' (bits, activation type), in the order of the names.
const CPA_KINDS: [(usize, &str); 4] = [(2, "bf16"), (4, "bf16"), (2, "f16"), (4, "f16")];
/// Warps per block of the cp.async kernel (`HC_CPA_WARPS`).
pub(crate) const CPA_WARPS: u32 = 8;
/// Stages of each warp's ring in the cp.async kernel (`HC_CPA_STAGES`; 3 measured faster
/// than 2, 4 and 6 on an H200).
const CPA_STAGES: u32 = 3;

/// The batch-1 affine kernel fed by cp.async (`hc_affine_cpa_b{bits}_{dtype}`) for 2- or
/// 4-bit codes under bf16 or f16 activations; it takes what the tensor-core kernel takes
/// with 4 code words per lane.
pub(crate) fn affine_cpa(bits: usize, dtype: crate::Dtype) -> Option<usize> {
    let t = match dtype {
        crate::Dtype::Bf16 => "bf16",
        crate::Dtype::F16 => "f16",
        crate::Dtype::F32 => return None,
    };
    let kind = CPA_KINDS.iter().position(|&k| k == (bits, t))?;
    Some(trellis_encode(4, 1) + 1 + kind)
}

/// The activation types of the batch-1 cp.async kernel for groups of half its step, 4-bit
/// codes only (`hc_affine_cpa_halves_b4_*`: at 2 bits the plain tensor-core kernel ran
/// 1.3× faster for groups of 128 on an H100, `docs/eval/cuda_int4_variants.md`).
const CPA_HALVES_TYPES: [&str; 2] = ["bf16", "f16"];

/// The batch-1 cp.async kernel for groups of half its step (two groups' scale pairs a
/// stage, a lane's words from both), if compiled for the bits and activation type.
pub(crate) fn affine_cpa_halves(bits: usize, dtype: crate::Dtype) -> Option<usize> {
    let t = match dtype {
        crate::Dtype::Bf16 => "bf16",
        crate::Dtype::F16 => "f16",
        crate::Dtype::F32 => return None,
    };
    let kind = CPA_HALVES_TYPES
        .iter()
        .position(|&k| k == t)
        .filter(|_| bits == 4)?;
    Some(e8_prefix_two(E8P_TWO_FORMS[E8P_TWO_FORMS.len() - 1].1, true)? + 1 + kind)
}

/// Dynamic shared memory of [`affine_cpa`]'s kernel (`groups` 1) or [`affine_cpa_halves`]'s
/// (2): `HC_CPA_WARPS · (HC_CPA_STAGES · sizeof(HcCpaStage) + 64)`, a stage holding 1 KB of
/// codes, 128 bytes of scale pairs a group and 4 lanes' activations.
pub(crate) fn affine_cpa_shared(bits: usize, groups: usize) -> u32 {
    let stage = 1024 + 128 * groups + 4 * 4 * (16 / bits.max(1)) * 4;
    CPA_WARPS * (CPA_STAGES * stage as u32 + 64)
}

/// The tensor-core affine kernels' (bits, activation type), in the order of the names.
const MMA_KINDS: [(usize, &str); 5] =
    [(2, "bf16"), (4, "bf16"), (2, "f16"), (4, "f16"), (8, "f16")];
/// Their code words per lane and step.
const MMA_WORDS: [usize; 3] = [1, 2, 4];

/// Weight rows a block of the tensor-core kernel computes for a batch (`16·HC_MMA_R`).
pub(crate) fn mma_rows_per_block(batch: usize) -> usize {
    if batch > 8 {
        32
    } else {
        16
    }
}

/// The tensor-core affine kernel of `bits` for activations of `dtype` (bf16 or f16), `words`
/// code words per lane and step (1, 2 or 4) and `batch` rows (up to 16), if compiled.
pub(crate) fn affine_mma(
    bits: usize,
    dtype: crate::Dtype,
    words: usize,
    batch: usize,
) -> Option<usize> {
    let t = match dtype {
        crate::Dtype::Bf16 => "bf16",
        crate::Dtype::F16 => "f16",
        crate::Dtype::F32 => return None,
    };
    let kind = MMA_KINDS.iter().position(|&k| k == (bits, t))?;
    let w = MMA_WORDS.iter().position(|&w| w == words)?;
    if batch == 0 || batch > 16 {
        return None;
    }
    let n = usize::from(batch > 8);
    Some(
        FIXED
            + 3 * BATCH_TILES.len()
            + 7 * E8_PASSES.len()
            + TRELLIS_KS.len() * BATCH_TILES.len()
            + MMA_WORDS.len() * (2 * kind + n)
            + w,
    )
}
pub(crate) const RHT: usize = 0;
pub(crate) const AFFINE_DECODE: usize = 1;
pub(crate) const E8_DECODE: usize = 2;
pub(crate) const E8_HALVES: usize = 3;
pub(crate) const AFFINE_GENERIC: usize = 4;
pub(crate) const E8_ANY: usize = 5;
pub(crate) const RHT_FAST: usize = 6;
/// The chunked affine decoder of `bits` (1 to 8).
pub(crate) fn affine_decode_chunks(bits: usize) -> usize {
    match bits {
        2 => 7,
        4 => 8,
        8 => 9,
        _ => after_wgmma() + ODD_BITS.len() * BATCH_TILES.len() + odd_index(bits),
    }
}

/// `bits`' place in [`ODD_BITS`] (the last width for any other).
fn odd_index(bits: usize) -> usize {
    ODD_BITS
        .iter()
        .position(|&b| b == bits)
        .unwrap_or(ODD_BITS.len() - 1)
}
pub(crate) const TRELLIS_DECODE: usize = 10;
/// Pieces of 8 values each thread of the chunked affine decoders and of the E8 decoder takes
/// (`HC_DEC_U` in `kernels/gemv.cu`): they run on `ceil(pieces / DECODE_PIECES)` threads.
pub(crate) const DECODE_PIECES: usize = 4;
pub(crate) const KV_E8_ENCODE: usize = 11;
pub(crate) const KV_E8_DECODE: usize = 12;
pub(crate) const E8_RANS_DECODE: usize = 13;
/// The rANS E8 GEMV for a pass of exactly `batch` rows (1..=4): `hc_e8_rans_gemv_m{batch}`.
pub(crate) fn e8_rans_gemv(batch: usize) -> usize {
    14 + batch.clamp(1, 4) - 1
}
pub(crate) const QUANT_I8: usize = 18;
/// The per-token FP8 E4M3 activation kernel (`hc_quant_f8`, after the pair encoders).
pub(crate) fn quant_f8() -> usize {
    trellis_encode(PAIR_ENCODE_KS, 2) + 1
}
/// Its block-scaled form (`hc_quant_f8_blocks`).
pub(crate) fn quant_f8_blocks() -> usize {
    quant_f8() + 1
}
/// The batch-1 cp.async kernel over several layers that read one activation row
/// (`hc_affine_cpa_group_b{bits}_{dtype}`, last), where [`affine_cpa`] has a kernel.
pub(crate) fn affine_cpa_group(bits: usize, dtype: crate::Dtype) -> Option<usize> {
    let kind = affine_cpa(bits, dtype)? - affine_cpa(2, crate::Dtype::Bf16)?;
    Some(quant_f8_blocks() + 1 + kind)
}
/// Runs of `hc_quant_f8_blocks` a warp takes (`HC_QF8_RUNS`; 8 warps a block).
pub(crate) const QF8_RUNS: usize = 4;
pub(crate) const W8A8_OUT: usize = 19;
pub(crate) const KV_E8_ATTEND: usize = 20;
pub(crate) const KV_ATTEND_MERGE: usize = 21;
/// Queries one block of `hc_kv_e8_attend` takes (`HC_KV_G`).
pub(crate) const KV_ATTEND_QUERIES: usize = 8;
/// Functions before the templated GEMVs.
const FIXED: usize = 22;
/// The trellis GEMVs' compiled K (0: K read at run time).
const TRELLIS_KS: [usize; 5] = [0, 1, 2, 3, 4];

/// The trellis GEMV for a pass of `batch` rows of `k` bits per value.
pub(crate) fn trellis_gemv(batch: usize, k: usize) -> usize {
    let ki = if (1..=4).contains(&k) { k } else { 0 };
    FIXED + 3 * BATCH_TILES.len() + 7 * E8_PASSES.len() + TRELLIS_KS.len() * tile_index(batch) + ki
}
/// The trellis group GEMV's batch tiles.
const TRELLIS_GROUP_TILES: [usize; 3] = [1, 2, 4];

/// The trellis GEMV's group path (`hc_trellis_groups_m{1,2,4}_k{k}[_v2]`, see
/// [`crate::TrellisGemv::whole_groups`]) for a pass of `batch` (1..=4) rows of `k` (1..=4) bits
/// and `v` (1 or 2) values per state.
pub(crate) fn trellis_groups(batch: usize, k: usize, v: u8) -> usize {
    let tile = match batch {
        0 | 1 => 0,
        2 => 1,
        _ => 2,
    };
    let first = if v == 2 {
        pair_kernels()
    } else {
        FIXED
            + 3 * BATCH_TILES.len()
            + 7 * E8_PASSES.len()
            + TRELLIS_KS.len() * BATCH_TILES.len()
            + MMA_KINDS.len() * 2 * MMA_WORDS.len()
    };
    first + 4 * tile + k.clamp(1, 4) - 1
}

/// The first of the pair code's group kernels (after the tensor-core GEMMs).
fn pair_kernels() -> usize {
    trellis_encode(4, 1) + 1 + CPA_KINDS.len() * (1 + GEMM_SHAPES.len())
}
/// Weight rows one block of the trellis group GEMV computes for a pass of `batch` rows
/// (`HC_TG_R`).
pub(crate) fn trellis_group_rows(batch: usize) -> usize {
    if batch <= 1 {
        4
    } else {
        8
    }
}
/// The group path's decoder for `k` (1..=4) bits and `v` values per state:
/// `hc_trellis_decode_groups_k{k}[_v2]`.
pub(crate) fn trellis_decode_groups(k: usize, v: u8) -> usize {
    trellis_groups(4, 4, v) + k.clamp(1, 4)
}
/// The trellis group path through the tensor cores (`hc_trellis_mma_k{k}_v{v}_n{nt}`) for `k`
/// (1..=4) bits, `v` (1 or 2) values per state and `nt` (1 or 2) batch tiles of 8.
pub(crate) fn trellis_mma(k: usize, v: u8, nt: usize) -> usize {
    trellis_decode_groups(4, 2)
        + 1
        + 8 * (v.clamp(1, 2) as usize - 1)
        + 4 * (nt.clamp(1, 2) - 1)
        + k.clamp(1, 4)
        - 1
}
/// Warps per block of the trellis tensor-core kernel (`HC_TM_WARPS`).
pub(crate) const TRELLIS_MMA_WARPS: u32 = 8;
/// Weight rows per block of the trellis tensor-core kernel (16·`HC_TM_R`).
pub(crate) const TRELLIS_MMA_ROWS: usize = 32;
/// The trellis encoder for `k` (1..=4) bits and `v` values per state:
/// `hc_trellis_encode_k{k}`, or for pairs (`k` up to [`PAIR_ENCODE_KS`])
/// `hc_trellis_encode_k{k}_v2`.
pub(crate) fn trellis_encode(k: usize, v: u8) -> usize {
    if v == 2 {
        trellis_mma(4, 2, 2) + k.clamp(1, PAIR_ENCODE_KS)
    } else {
        trellis_decode_groups(4, 1) + k.clamp(1, 4)
    }
}
/// The pair code's largest `K` the GPU encoder runs: a step of `2K` bits fans out to `2^2K`
/// predecessors a state, whose back pointers fill the ring's 64-bit words at `2K = 4`.
pub(crate) const PAIR_ENCODE_KS: usize = 2;
/// The kernels' batch tiles (activation rows held in registers).
const BATCH_TILES: [usize; 2] = [1, 4];

fn tile_index(batch: usize) -> usize {
    usize::from(batch > 1)
}

/// Weight rows one block of the GEMVs computes for a pass of `batch` rows (`HC_R`).
pub(crate) fn rows_per_block(batch: usize) -> usize {
    if batch == 1 {
        4
    } else {
        2
    }
}

/// The aligned affine GEMV of `bits` (1 to 8) for a pass of `batch` rows.
pub(crate) fn affine_gemv(bits: usize, batch: usize) -> usize {
    let b = match bits {
        2 => 0,
        4 => 1,
        8 => 2,
        _ => return after_wgmma() + BATCH_TILES.len() * odd_index(bits) + tile_index(batch),
    };
    FIXED + BATCH_TILES.len() * b + tile_index(batch)
}

/// The E8 GEMVs' passes: up to 1, 2 or 4 activation rows (`hc_e8_gemv_b{B}_m{1,2,4}`).
const E8_PASSES: [usize; 3] = [1, 2, 4];

/// The E8 GEMV of `bits` (2..=8) for a pass of `batch` rows (1..=4).
pub(crate) fn e8_gemv(bits: usize, batch: usize) -> usize {
    let pass = E8_PASSES.iter().position(|&m| batch <= m).unwrap_or(2);
    FIXED + 3 * BATCH_TILES.len() + E8_PASSES.len() * (bits - 2) + pass
}

/// Weight rows one block of the E8 GEMV computes for a pass of `batch` rows: the activations
/// are read once per block (`hc_e8_gemv_b{B}_m{M}` in kernels/gemv.cu).
pub(crate) fn e8_rows_per_block(batch: usize) -> usize {
    if batch <= 2 {
        4
    } else {
        8
    }
}

/// The kernels' `AffineArgs` (kernels/gemv.cu), field for field.
#[repr(C)]
pub(crate) struct AffineArgs {
    codes: u64,
    scales: u64,
    offsets: u64,
    x: u64,
    y: u64,
    bias: u64,
    n_code_bytes: i64,
    xdtype: i32,
    ydtype: i32,
    m: i32,
    rows: i32,
    cols: i32,
    bits: i32,
    glen: i32,
    srs: i32,
    qmul: f32,
    qbias: f32,
    glen_log2: i32,
    sdtype: i32,
}

/// The kernels' `AffineGroupArgs` (kernels/gemv.cu): up to [`crate::AFFINE_GROUP_MAX`]
/// layers' arguments and the row tiles before each.
#[repr(C)]
pub(crate) struct AffineGroupArgs {
    a: [AffineArgs; crate::AFFINE_GROUP_MAX],
    first: [i32; crate::AFFINE_GROUP_MAX + 1],
    n: i32,
}

impl AffineGroupArgs {
    /// The arguments of `layers` (1 to `AFFINE_GROUP_MAX`, each of at most `i32::MAX / 2`
    /// rows: the caller checks); the slots past them repeat the last layer (never read).
    pub(crate) fn new(layers: &[AffineGemv]) -> Self {
        let n = layers.len().clamp(1, crate::AFFINE_GROUP_MAX);
        let mut first = [0i32; crate::AFFINE_GROUP_MAX + 1];
        for i in 0..crate::AFFINE_GROUP_MAX {
            let tiles = layers
                .get(i)
                .filter(|_| i < n)
                .map_or(0, |a| a.rows.div_ceil(16));
            first[i + 1] = first[i] + tiles as i32;
        }
        AffineGroupArgs {
            a: std::array::from_fn(|i| AffineArgs::new(&layers[i.min(n - 1)])),
            first,
            n: n as i32,
        }
    }

    /// Blocks of the launch: every layer's row tiles.
    pub(crate) fn tiles(&self) -> u32 {
        self.first[crate::AFFINE_GROUP_MAX] as u32
    }
}

impl AffineArgs {
    pub(crate) fn new(a: &AffineGemv) -> Self {
        AffineArgs {
            codes: a.codes,
            scales: a.scales,
            offsets: a.offsets,
            x: a.x,
            y: a.y,
            bias: a.bias,
            n_code_bytes: a.code_bytes as i64,
            xdtype: a.x_dtype as i32,
            ydtype: a.y_dtype as i32,
            m: a.batch as i32,
            rows: a.rows as i32,
            cols: a.cols as i32,
            bits: a.bits as i32,
            glen: a.group_len.max(1).min(i32::MAX as usize) as i32,
            srs: a.scales_per_row.min(i32::MAX as usize) as i32,
            qmul: a.qmul,
            qbias: a.qbias,
            glen_log2: if a.group_len.is_power_of_two() && a.group_len <= i32::MAX as usize {
                a.group_len.trailing_zeros() as i32
            } else {
                -1
            },
            sdtype: a.scale_dtype as i32,
        }
    }
}

/// The kernels' `E8Args`.
#[repr(C)]
pub(crate) struct E8Args {
    packed: u64,
    row_scales: u64,
    xr: u64,
    half: u64,
    y: u64,
    bias: u64,
    ydtype: i32,
    m: i32,
    rows: i32,
    words: i32,
    bits: i32,
}

impl E8Args {
    pub(crate) fn new(a: &E8Gemv) -> Self {
        E8Args {
            packed: a.packed,
            row_scales: a.row_scales,
            xr: a.xr,
            half: a.half,
            y: a.y,
            bias: a.bias,
            ydtype: a.y_dtype as i32,
            m: a.batch as i32,
            rows: a.rows as i32,
            words: a.words as i32,
            bits: a.bits as i32,
        }
    }
}

/// The kernels' `E8RansArgs`.
#[repr(C)]
pub(crate) struct E8RansArgs {
    payload: u64,
    index: u64,
    slots: u64,
    row_scales: u64,
    xr: u64,
    y: u64,
    bias: u64,
    words: i64,
    ydtype: i32,
    m: i32,
    rows: i32,
    spr: i32,
    chunk: i32,
    chunks: i32,
    pb: i32,
}

impl E8RansArgs {
    pub(crate) fn new(a: &crate::E8RansGemv) -> Self {
        E8RansArgs {
            payload: a.payload,
            index: a.index,
            slots: a.slots,
            row_scales: a.row_scales,
            xr: a.xr,
            y: a.y,
            bias: a.bias,
            words: (a.payload_bytes / 2) as i64,
            ydtype: a.y_dtype as i32,
            m: a.batch as i32,
            rows: a.rows as i32,
            spr: (8 * a.words) as i32,
            chunk: a.chunk as i32,
            chunks: a.chunks() as i32,
            pb: a.prob_bits as i32,
        }
    }
}

/// The kernels' `E8PrefixArgs` (kernels/e8_prefix.cuh).
#[repr(C)]
pub(crate) struct E8PrefixArgs {
    words: u64,
    index: u64,
    table: u64,
    row_scales: u64,
    xr: u64,
    y: u64,
    bias: u64,
    nwords: i64,
    rows: i32,
    cols: i32,
    rows_per_chunk: i32,
    chunks: i32,
    segments: i32,
    seg_blocks: i32,
    m: i32,
    y_dtype: i32,
}

impl E8PrefixArgs {
    pub(crate) fn new(a: &crate::E8PrefixGemv) -> Self {
        E8PrefixArgs {
            words: a.words,
            index: a.index,
            table: a.table,
            row_scales: a.row_scales,
            xr: a.xr,
            y: a.y,
            bias: a.bias,
            nwords: a.payload_words as i64,
            rows: a.rows as i32,
            cols: a.cols as i32,
            // The rows8 kernels: rows a chunk spans (8 · span).
            rows_per_chunk: (8 * a.span) as i32,
            chunks: a.chunks() as i32,
            segments: a.segments() as i32,
            // A segment past the row is the row (one segment).
            seg_blocks: a.segment.min(a.cols / 32) as i32,
            m: a.batch as i32,
            y_dtype: a.y_dtype as i32,
        }
    }
}

/// The kernels' `TrellisArgs`.
#[repr(C)]
pub(crate) struct TrellisArgs {
    bits: u64,
    row_scales: u64,
    xr: u64,
    y: u64,
    bias: u64,
    n_bytes: i64,
    row_bytes: i64,
    ydtype: i32,
    m: i32,
    rows: i32,
    cols: i32,
    l: i32,
    k: i32,
    seq: i32,
    c1: f32,
    c0: f32,
    v: i32,
    xr16: u64,
}

impl TrellisArgs {
    pub(crate) fn new(a: &crate::TrellisGemv) -> Self {
        TrellisArgs {
            bits: a.bits,
            row_scales: a.row_scales,
            xr: a.xr,
            y: a.y,
            bias: a.bias,
            n_bytes: a.bit_bytes as i64,
            row_bytes: a.row_bytes as i64,
            ydtype: a.y_dtype as i32,
            m: a.batch as i32,
            rows: a.rows as i32,
            cols: a.cols as i32,
            l: a.l as i32,
            k: a.k as i32,
            seq: a.seq as i32,
            c1: a.c1,
            c0: a.c0,
            v: a.v as i32,
            xr16: a.xr16,
        }
    }
}

/// The kernels' `KvArgs`.
#[repr(C)]
pub(crate) struct KvArgs {
    x: u64,
    out: u64,
    codes: u64,
    scales: u64,
    out_row: i64,
    codes_row: i64,
    scales_row: i64,
    dtype: i32,
    rows: i32,
    toks: i32,
    d: i32,
    bits: i32,
    code_bytes: i32,
    tile: i32,
    alpha: f32,
    seed: u64,
}

/// The kernels' `KvAttendArgs`.
#[repr(C)]
pub(crate) struct KvAttendArgs {
    k: KvArgs,
    v: KvArgs,
    q: u64,
    bias: u64,
    part_o: u64,
    part_ml: u64,
    ek: u64,
    ev: u64,
    bias_b: i64,
    bias_q: i64,
    g: i32,
    qlen: i32,
    heads: i32,
    bias0: i32,
    chunk: i32,
    chunks: i32,
    exact: i32,
    edtype: i32,
    scaling: f32,
}

/// The kernels' `KvMergeArgs`.
#[repr(C)]
pub(crate) struct KvMergeArgs {
    part_o: u64,
    part_ml: u64,
    out: u64,
    rows: i32,
    chunks: i32,
    g: i32,
    d: i32,
    qlen: i32,
    heads: i32,
    odtype: i32,
}

impl KvMergeArgs {
    pub(crate) fn new(a: &crate::KvE8Attend) -> Self {
        KvMergeArgs {
            part_o: a.part_o,
            part_ml: a.part_ml,
            out: a.out,
            rows: a.keys.rows as i32,
            chunks: a.chunks() as i32,
            g: a.queries as i32,
            d: a.keys.dim as i32,
            qlen: a.query_len as i32,
            heads: a.heads as i32,
            odtype: a.out_dtype as i32,
        }
    }
}

impl KvAttendArgs {
    pub(crate) fn new(a: &crate::KvE8Attend) -> Self {
        KvAttendArgs {
            k: KvArgs::new(&a.keys),
            v: KvArgs::new(&a.values),
            q: a.q,
            bias: a.bias,
            part_o: a.part_o,
            part_ml: a.part_ml,
            ek: a.exact_keys,
            ev: a.exact_values,
            bias_b: a.bias_batch as i64,
            bias_q: a.bias_query as i64,
            g: a.queries as i32,
            qlen: a.query_len as i32,
            heads: a.heads as i32,
            bias0: a.bias_first as i32,
            chunk: a.chunk as i32,
            chunks: a.chunks() as i32,
            exact: a.exact as i32,
            edtype: a.exact_dtype as i32,
            scaling: a.scaling,
        }
    }
}

impl KvArgs {
    pub(crate) fn new(a: &crate::KvE8) -> Self {
        KvArgs {
            x: a.x,
            out: a.out,
            codes: a.codes,
            scales: a.scales,
            out_row: a.out_row as i64,
            codes_row: a.codes_row as i64,
            scales_row: a.scales_row as i64,
            dtype: a.dtype as i32,
            rows: a.rows as i32,
            toks: a.toks as i32,
            d: a.dim as i32,
            bits: a.bits as i32,
            code_bytes: a.code_bytes() as i32,
            tile: a.tile as i32,
            alpha: a.alpha,
            seed: a.seed,
        }
    }
}

/// `TrellisEncodeArgs` of `kernels/trellis_encode.cu`.
#[repr(C)]
pub(crate) struct TrellisEncodeArgs {
    pub x: u64,
    pub bits: u64,
    pub scratch: u64,
    pub row_bytes: i64,
    pub scratch_stride: i64,
    pub rows: i32,
    pub cols: i32,
    pub seq: i32,
    pub per_row: i32,
    pub l: i32,
    pub ring: i32,
    pub w1: i32,
    pub w2: i32,
    pub rpt: i32,
    pub global_bp: i32,
    pub c1: f32,
    pub c0: f32,
}
