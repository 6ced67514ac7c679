//! The autofusion runtime: tensors, devices, the executor with DynamicTiling, the thread pool
//! and the reference interpreter. Users reach it through the `autofusion` crate.
//!
//! ```
//! use autofusion_runtime::{Tensor, DType};
//! let t = Tensor::from_f32(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
//! assert_eq!(t.to_dtype(DType::F16).unwrap().to_f32_vec(), t.to_f32_vec());
//! ```

#[cfg(feature = "ascend")]
pub mod ascend;
pub mod error;
pub mod exec;
pub mod library;
pub mod machine;
pub mod memory;
pub mod npy;
pub mod packs;
pub mod pool;
pub mod reference;
pub mod session;
pub mod session_bench;
pub mod tensor;
pub mod tiling;
pub mod weights;

pub use autofusion_ir::ir::DType;
pub use error::{Error, Result};
pub use exec::Module;
pub use session::{Decoder, Runner, Session};
pub use tensor::{tolerance, Tensor};

/// Where fused kernels run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Device {
    /// The host CPU (generated C, thread pool).
    Cpu,
    /// Ascend NPU number `n` (needs the `ascend` feature and a CANN install).
    Ascend(u32),
}

impl Device {
    /// Check that the device can run kernels in this build.
    pub fn check(self) -> Result<()> {
        match self {
            Device::Cpu => Ok(()),
            #[cfg(feature = "ascend")]
            Device::Ascend(n) => ascend::check_device(n),
            #[cfg(not(feature = "ascend"))]
            Device::Ascend(n) => Err(Error::Device {
                device: format!("Ascend({n})"),
                msg: "this build has no Ascend support: build with `--features ascend` on a machine with the CANN toolkit".into(),
            }),
        }
    }
}

/// Items the `#[fused_graph]` expansion refers to. Not a public API.
#[doc(hidden)]
pub mod __private {
    #[cfg(feature = "ascend")]
    pub use crate::ascend::AscendModule;
    pub use crate::exec::{AfModule, Module, PLANS_KEPT};
    pub use crate::weights::{load as load_weights, WeightRef};
    pub use autofusion_ir::ir::DType;
    pub use once_cell::sync::OnceCell;

    /// `a == b` in const context (the build-output check of the macro expansion).
    pub const fn str_eq(a: &str, b: &str) -> bool {
        let (a, b) = (a.as_bytes(), b.as_bytes());
        if a.len() != b.len() {
            return false;
        }
        let mut i = 0;
        while i < a.len() {
            if a[i] != b[i] {
                return false;
            }
            i += 1;
        }
        true
    }

    /// Load a module once (the expansion keeps one cell per graph variant).
    ///
    /// # Safety
    /// `ptr` must be what the generated module function named `symbol` returned.
    pub unsafe fn load(
        cell: &'static OnceCell<Module>,
        ptr: *const AfModule,
        symbol: &str,
    ) -> crate::Result<&'static Module> {
        // SAFETY: by the caller's contract `ptr` is the module descriptor named `symbol`.
        cell.get_or_try_init(|| unsafe { Module::from_raw(ptr, symbol) })
    }

    /// Run on `device`: the CPU module, or (feature `ascend`) the Ascend module from `ascend`.
    pub fn run_on(
        device: crate::Device,
        cpu: &dyn Fn() -> crate::Result<&'static Module>,
        #[cfg(feature = "ascend")] ascend: &dyn Fn() -> crate::Result<
            &'static crate::ascend::AscendModule,
        >,
        inputs: &[&crate::Tensor],
    ) -> crate::Result<Vec<crate::Tensor>> {
        match device {
            crate::Device::Cpu => cpu()?.run(inputs),
            #[cfg(feature = "ascend")]
            crate::Device::Ascend(n) => ascend()?.run(n, inputs),
            #[cfg(not(feature = "ascend"))]
            d @ crate::Device::Ascend(_) => {
                d.check()?;
                unreachable!("Device::check rejects Ascend without the feature")
            }
        }
    }

    /// `run_on` for a graph that keeps state (`Module::run_with_state`).
    pub fn run_on_with_state(
        device: crate::Device,
        cpu: &dyn Fn() -> crate::Result<&'static Module>,
        #[cfg(feature = "ascend")] ascend: &dyn Fn() -> crate::Result<
            &'static crate::ascend::AscendModule,
        >,
        inputs: &[&crate::Tensor],
        state: &mut [&mut crate::Tensor],
        call_dims: &[(&str, i64)],
    ) -> crate::Result<Vec<crate::Tensor>> {
        match device {
            crate::Device::Cpu => cpu()?.run_with_state(inputs, state, call_dims),
            #[cfg(feature = "ascend")]
            crate::Device::Ascend(n) => ascend()?.run_with_state(n, inputs, state, call_dims),
            #[cfg(not(feature = "ascend"))]
            d @ crate::Device::Ascend(_) => {
                d.check()?;
                unreachable!("Device::check rejects Ascend without the feature")
            }
        }
    }

    /// A caller dim as the runtime takes it (`Err` past `i64::MAX`).
    pub fn dim_value(v: usize) -> crate::Result<i64> {
        i64::try_from(v).map_err(|_| crate::Error::Dims {
            graph: String::new(),
            msg: format!("a dim of {v} does not fit in i64"),
        })
    }

    /// Load an Ascend module once (feature `ascend`).
    #[cfg(feature = "ascend")]
    pub fn load_ascend(
        cell: &'static OnceCell<crate::ascend::AscendModule>,
        cpu: &'static Module,
        launch: crate::ascend::LaunchFn,
        json: unsafe extern "C" fn() -> *const std::ffi::c_char,
        symbol: &str,
    ) -> crate::Result<&'static crate::ascend::AscendModule> {
        // SAFETY: `launch` and `json` are the generated `<symbol>_launch` / `<symbol>_ascend_json`
        // of the graph whose CPU module is `cpu` (the macro expansion pairs them).
        cell.get_or_try_init(|| unsafe {
            crate::ascend::AscendModule::from_raw(cpu.graph().clone(), launch, json, symbol)
        })
    }

    /// The outputs of a run as an array of the arity the signature declares.
    pub fn outputs<const N: usize>(
        v: Vec<crate::Tensor>,
        symbol: &str,
    ) -> crate::Result<[crate::Tensor; N]> {
        let n = v.len();
        v.try_into().map_err(|_| crate::Error::Module {
            symbol: symbol.into(),
            msg: format!("returned {n} outputs, the signature declares {N}"),
        })
    }
}
