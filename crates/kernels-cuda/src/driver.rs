//! The driver side: the primary context, the module loaded from the embedded PTX, launches.

use crate::args::function_names;
use crate::{CudaError, Result};
use cudarc::driver::sys;
use std::ffi::{c_void, CString};

/// The PTX built from `kernels/gemv.cu` by `cargo xtask ptx`.
const PTX: &str = include_str!("../ptx/gemv.ptx");

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
    module: sys::CUmodule,
    functions: Vec<sys::CUfunction>,
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
    pub(crate) fn load(ordinal: usize) -> Result<Self> {
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
                module: std::ptr::null_mut(),
                functions: Vec::new(),
            };
            let _p = Pushed::new(ctx)?;
            let ptx = CString::new(PTX).expect("the embedded PTX has no NUL");
            check(
                "cuModuleLoadData",
                sys::cuModuleLoadData(&mut m.module, ptx.as_ptr() as *const c_void),
            )?;
            for name in function_names() {
                let cname = CString::new(name).expect("kernel names have no NUL");
                let mut f = std::ptr::null_mut();
                check(
                    "cuModuleGetFunction",
                    sys::cuModuleGetFunction(&mut f, m.module, cname.as_ptr()),
                )?;
                m.functions.push(f);
            }
            Ok(m)
        }
    }

    /// Launches function `f` on `stream` (a raw `CUstream`; 0 is the legacy default stream).
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
        // SAFETY: the function belongs to this module; the caller vouches for the parameters.
        check("cuLaunchKernel", unsafe {
            sys::cuLaunchKernel(
                self.functions[f],
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

impl Drop for Module {
    fn drop(&mut self) {
        // SAFETY: the module was loaded in this retained context; both are released once.
        unsafe {
            if !self.module.is_null() {
                if let Ok(_p) = Pushed::new(self.ctx) {
                    sys::cuModuleUnload(self.module);
                }
            }
            sys::cuDevicePrimaryCtxRelease_v2(self.device);
        }
    }
}
