//! The driver side: the primary context, the module loaded from the embedded PTX, launches.

use crate::args::{function_names, kernel_modules, PTX};
use crate::{CudaError, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};

/// Dynamic shared memory a launch gets without opting in.
const DEFAULT_SHARED: u32 = 48 * 1024;

fn check(call: &'static str, r: sys::CUresult) -> Result<()> {
    if r == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(CudaError::Driver {
            call,
            code: r as i32,
        })
    }
}

/// A loaded module in a device's primary context.
pub(crate) struct Module {
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// By the index of [`PTX`]; `None` for a module not loaded.
    modules: [Option<sys::CUmodule>; PTX.len()],
    /// By the index of `function_names`; for a kernel of a module not loaded (built for another
    /// compute capability, its route off, or its load failed), the error a launch of it returns.
    functions: Vec<Result<sys::CUfunction>>,
    /// Blocks resident at once by (function, threads, dynamic shared memory).
    resident: std::sync::Mutex<std::collections::HashMap<(usize, u32, u32), u32>>,
    /// Dynamic shared memory a block may opt in to (bytes).
    max_shared: u32,
    /// Multiprocessors.
    sms: u32,
}

// SAFETY: driver handles may be used from any thread once their context is current; every
// use below pushes the context first.
unsafe impl Send for Module {}
// SAFETY: as above; launches do not mutate the module.
unsafe impl Sync for Module {}

/// Makes `ctx` current for the scope.
struct Pushed;

impl Pushed {
    fn new(ctx: sys::CUcontext) -> Result<Self> {
        // SAFETY: `ctx` is a retained primary context.
        check("cuCtxPushCurrent", unsafe { sys::cuCtxPushCurrent_v2(ctx) })?;
        Ok(Pushed)
    }
}

impl Drop for Pushed {
    fn drop(&mut self) {
        let mut old = std::ptr::null_mut();
        // SAFETY: pops what `new` pushed.
        unsafe { sys::cuCtxPopCurrent_v2(&mut old) };
    }
}

impl Module {
    /// Loads the modules on device `ordinal`; those built for one compute capability
    /// ([`PTX`]'s third field) only where the device has it and `arch_modules` asks for them.
    pub(crate) fn load(ordinal: usize, arch_modules: bool) -> Result<Self> {
        // SAFETY: only probes for the driver library.
        if !unsafe { sys::is_culib_present() } {
            return Err(CudaError::NoDevice(
                "the CUDA driver library is not installed".into(),
            ));
        }
        // SAFETY: plain driver calls with out-pointers to locals.
        unsafe {
            check("cuInit", sys::cuInit(0)).map_err(|e| CudaError::NoDevice(e.to_string()))?;
            let mut count = 0;
            check("cuDeviceGetCount", sys::cuDeviceGetCount(&mut count))?;
            if ordinal >= count.max(0) as usize {
                return Err(CudaError::NoDevice(format!(
                    "device {ordinal} asked, {count} present"
                )));
            }
            let mut device = 0;
            check("cuDeviceGet", sys::cuDeviceGet(&mut device, ordinal as i32))?;
            let mut ctx = std::ptr::null_mut();
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut ctx, device),
            )?;
            let mut m = Module {
                device,
                ctx,
                modules: [None; PTX.len()],
                functions: Vec::new(),
                resident: Default::default(),
                max_shared: DEFAULT_SHARED,
                sms: 1,
            };
            let mut sms = 0;
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(
                    &mut sms,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                    device,
                ),
            )?;
            m.sms = sms.max(1) as u32;
            let mut optin = 0;
            check(
                "cuDeviceGetAttribute",
                sys::cuDeviceGetAttribute(
                    &mut optin,
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                    device,
                ),
            )?;
            m.max_shared = (optin.max(0) as u32).max(DEFAULT_SHARED);
            let mut cc = (0, 0);
            for (attr, out) in [
                (
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                    &mut cc.0,
                ),
                (
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                    &mut cc.1,
                ),
            ] {
                check(
                    "cuDeviceGetAttribute",
                    sys::cuDeviceGetAttribute(out, attr, device),
                )?;
            }
            let _p = Pushed::new(ctx)?;
            let mut failed: [Option<CudaError>; PTX.len()] = Default::default();
            for (i, (text, required, arch)) in PTX.into_iter().enumerate() {
                if arch.is_some_and(|a| !arch_modules || a != cc) {
                    continue;
                }
                let ptx = CString::new(text).expect("the embedded PTX has no NUL");
                let mut module = std::ptr::null_mut();
                match check(
                    "cuModuleLoadData",
                    sys::cuModuleLoadData(&mut module, ptx.as_ptr() as *const c_void),
                ) {
                    Ok(()) => m.modules[i] = Some(module),
                    Err(e) if !required => failed[i] = Some(e),
                    Err(e) => return Err(e),
                }
            }
            let names = function_names();
            // Each kernel in the module that declares it: one missing from a loaded module is
            // an error; those of a module not loaded stay missing (launching one is an error).
            let homes = kernel_modules(&names).map_err(|name| {
                CudaError::InvalidArgument(format!("kernel {name} is in no embedded PTX module"))
            })?;
            for (name, home) in names.iter().zip(homes) {
                let Some(module) = m.modules[home] else {
                    m.functions
                        .push(Err(failed[home].clone().unwrap_or(CudaError::Driver {
                            call: "cuModuleGetFunction",
                            code: sys::CUresult::CUDA_ERROR_NOT_FOUND as i32,
                        })));
                    continue;
                };
                let cname = CString::new(name.as_str()).expect("kernel names have no NUL");
                let mut f = std::ptr::null_mut();
                check(
                    "cuModuleGetFunction",
                    sys::cuModuleGetFunction(&mut f, module, cname.as_ptr()),
                )?;
                m.functions.push(Ok(f));
            }
            Ok(m)
        }
    }

    /// Whether function `f` loaded.
    pub(crate) fn has(&self, f: usize) -> bool {
        self.functions[f].is_ok()
    }

    /// Function `f`, or why it is missing (its module's failed load, or not loaded here).
    fn function(&self, f: usize) -> Result<sys::CUfunction> {
        self.functions[f].clone()
    }

    /// Dynamic shared memory a block may use (bytes).
    pub(crate) fn max_shared(&self) -> u32 {
        self.max_shared
    }

    /// Streaming multiprocessors of the device.
    pub(crate) fn sms(&self) -> u32 {
        self.sms
    }

    /// Blocks of function `f` (`threads` each, `shared` bytes of dynamic shared memory) the
    /// whole device runs at once.
    pub(crate) fn resident_blocks(&self, f: usize, threads: u32, shared: u32) -> Result<u32> {
        // Asked of the driver once per shape: launches on a persistent grid ask on every call.
        let key = (f, threads, shared);
        if let Some(&n) = self.resident.lock().ok().as_ref().and_then(|m| m.get(&key)) {
            return Ok(n);
        }
        let _p = Pushed::new(self.ctx)?;
        self.opt_in(f, shared)?;
        let func = self.function(f)?;
        let mut n = 0;
        // SAFETY: a function of this module; plain out-pointer.
        check("cuOccupancyMaxActiveBlocksPerMultiprocessor", unsafe {
            sys::cuOccupancyMaxActiveBlocksPerMultiprocessor(
                &mut n,
                func,
                threads as i32,
                shared as usize,
            )
        })?;
        let n = n.max(1) as u32 * self.sms;
        if let Ok(mut m) = self.resident.lock() {
            m.insert(key, n);
        }
        Ok(n)
    }

    /// Lets function `f` take `shared` bytes of dynamic shared memory (above 48 KiB).
    fn opt_in(&self, f: usize, shared: u32) -> Result<()> {
        if shared > DEFAULT_SHARED {
            let func = self.function(f)?;
            // SAFETY: a function of this module; the size is capped at the device's.
            check("cuFuncSetAttribute", unsafe {
                sys::cuFuncSetAttribute(
                    func,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared.min(self.max_shared) as i32,
                )
            })?;
        }
        Ok(())
    }

    /// Launches function `f` on `stream` (a raw `CUstream`; 0 is the legacy default stream),
    /// opting in to `shared` bytes of dynamic shared memory when that is above 48 KiB.
    ///
    /// # Safety
    /// `params` point at values laid out as the kernel's parameters, whose device pointers
    /// are valid for what the kernel reads and writes.
    pub(crate) unsafe fn launch(
        &self,
        f: usize,
        grid: (u32, u32),
        block: u32,
        shared: u32,
        stream: u64,
        params: &mut [*mut c_void],
    ) -> Result<()> {
        let _p = Pushed::new(self.ctx)?;
        self.opt_in(f, shared)?;
        let func = self.function(f)?;
        // SAFETY: the function belongs to this module; the caller vouches for the parameters.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                func,
                grid.0,
                grid.1,
                1,
                block,
                1,
                1,
                shared,
                stream as usize as sys::CUstream,
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }
}

/// The driver's tensor map (`CUtensorMap`: 128 opaque bytes), a kernel parameter.
pub(crate) type TensorMap = sys::CUtensorMap;

/// A tensor map of the row-major matrix of `rows` × `cols` 16-bit values (`f16`, else bf16) at
/// device address `ptr`, as the Hopper GEMM's tensor-memory-accelerator copies read it: boxes of
/// `box_rows` rows × 64 columns (128 bytes) in the 128-byte swizzle, zeros past the edges, L2
/// promotion of 256 bytes. Encoded on the host (no device call); `ptr` 16-byte aligned and
/// `cols` a multiple of 8, else the driver refuses it (`CUDA_ERROR_INVALID_VALUE`).
pub(crate) fn tensor_map_2d(
    ptr: u64,
    f16: bool,
    rows: usize,
    cols: usize,
    box_rows: u32,
) -> Result<TensorMap> {
    // (The map is opaque: the driver writes all of it.)
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    let dims = [cols as u64, rows as u64];
    let strides = [2 * cols as u64];
    let boxes = [64u32, box_rows];
    let steps = [1u32, 1];
    let dtype = if f16 {
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_FLOAT16
    } else {
        sys::CUtensorMapDataType::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
    };
    // SAFETY: every array holds the rank's entries (strides: rank - 1); `map` is writable and
    // aligned as the driver's type.
    check("cuTensorMapEncodeTiled", unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            dtype,
            2,
            ptr as usize as *mut c_void,
            dims.as_ptr(),
            strides.as_ptr(),
            boxes.as_ptr(),
            steps.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
    })?;
    Ok(map)
}

/// Device memory the crate allocates itself (host-buffer conveniences only), freed on drop.
pub(crate) struct DeviceBuffer<'m> {
    module: &'m Module,
    ptr: sys::CUdeviceptr,
}

impl DeviceBuffer<'_> {
    pub(crate) fn ptr(&self) -> u64 {
        self.ptr
    }
}

impl Drop for DeviceBuffer<'_> {
    fn drop(&mut self) {
        if self.ptr != 0 {
            if let Ok(_p) = Pushed::new(self.module.ctx) {
                // SAFETY: allocated by `alloc` in this context, freed once.
                unsafe { sys::cuMemFree_v2(self.ptr) };
            }
        }
    }
}

impl Module {
    /// `bytes` of device memory (none for 0).
    pub(crate) fn alloc(&self, bytes: usize) -> Result<DeviceBuffer<'_>> {
        let mut ptr = 0;
        if bytes > 0 {
            let _p = Pushed::new(self.ctx)?;
            // SAFETY: plain out-pointer.
            check("cuMemAlloc", unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) })?;
        }
        Ok(DeviceBuffer { module: self, ptr })
    }

    /// Copies `src` to the start of `dst` (which holds at least as many bytes), synchronously.
    pub(crate) fn upload(&self, dst: &DeviceBuffer<'_>, src: &[u8]) -> Result<()> {
        if src.is_empty() {
            return Ok(());
        }
        let _p = Pushed::new(self.ctx)?;
        // SAFETY: the caller sized `dst`; `src` is a live host slice.
        check("cuMemcpyHtoD", unsafe {
            sys::cuMemcpyHtoD_v2(dst.ptr, src.as_ptr() as *const c_void, src.len())
        })
    }

    /// Copies the start of `src` into `dst`, after the work queued on the legacy default
    /// stream.
    pub(crate) fn download(&self, dst: &mut [u8], src: &DeviceBuffer<'_>) -> Result<()> {
        if dst.is_empty() {
            return Ok(());
        }
        let _p = Pushed::new(self.ctx)?;
        // SAFETY: the caller sized `src`; `dst` is a live host slice.
        check("cuMemcpyDtoH", unsafe {
            sys::cuMemcpyDtoH_v2(dst.as_mut_ptr() as *mut c_void, src.ptr, dst.len())
        })
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module was loaded in this retained context; both are released once.
        unsafe {
            if let Ok(_p) = Pushed::new(self.ctx) {
                for &module in self.modules.iter().flatten() {
                    sys::cuModuleUnload(module);
                }
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}
