//! Run-time choice of the instruction set: each hot loop is written once as portable Rust with
//! lane arrays the compiler vectorizes, and compiled twice — for the baseline target and, on
//! x86-64, with AVX2 + FMA enabled — the second chosen when the CPU has them.

/// True when the CPU running this process has AVX2 and FMA (checked once, then cached by std).
#[inline]
pub(crate) fn has_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::is_x86_feature_detected!("avx2") && std::is_x86_feature_detected!("fma")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// True when the CPU has AVX-512F and AVX-512BW (and AVX2 + FMA), unless the environment
/// variable `HYPERCODEC_NO_AVX512` is set (to compare with the AVX2 kernels). Read once.
#[inline]
pub(crate) fn has_avx512() -> bool {
    static AVX512: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *AVX512.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            has_avx2()
                && std::is_x86_feature_detected!("avx512f")
                && std::is_x86_feature_detected!("avx512bw")
                && std::env::var_os("HYPERCODEC_NO_AVX512").is_none()
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// True when [`has_avx512`] and the CPU also has AVX-512 VBMI and VNNI (byte permutations
/// and byte dot products). Read once.
#[inline]
pub(crate) fn has_avx512_vnni() -> bool {
    static VNNI: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *VNNI.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        {
            has_avx512()
                && std::is_x86_feature_detected!("avx512vbmi")
                && std::is_x86_feature_detected!("avx512vnni")
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            false
        }
    })
}

/// The instruction set the kernels use on this CPU.
pub fn simd_level() -> &'static str {
    if has_avx512() {
        "avx512+avx2+fma"
    } else if has_avx2() {
        "avx2+fma"
    } else {
        "baseline"
    }
}

/// Defines a function whose body is compiled for the baseline and for AVX2 + FMA; the AVX2
/// copy runs when [`has_avx2`] says the CPU has it. The body must not call anything that is
/// not `#[inline]` if it is to be vectorized.
macro_rules! multiversion {
    ($(#[$m:meta])* $v:vis fn $name:ident($($a:ident : $t:ty),* $(,)?) -> $r:ty $body:block) => {
        $(#[$m])*
        $v fn $name($($a: $t),*) -> $r {
            #[inline(always)]
            fn imp($($a: $t),*) -> $r $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($a: $t),*) -> $r {
                    imp($($a),*)
                }
                if $crate::simd::has_avx2() {
                    // SAFETY: the CPU has AVX2 and FMA (checked just above at run time).
                    return unsafe { avx2($($a),*) };
                }
            }
            imp($($a),*)
        }
    };
}
pub(crate) use multiversion;
