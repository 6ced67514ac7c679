//! The Rust glue of a fused module: the one generator of the entry points that `#[fused_graph]`
//! (the macro) and `Builder::onnx` (build.rs, which writes them to a file) give their users.
//! Both bind the build's exported descriptor functions, load the fused and unfused modules
//! once per process, and expose `unfused`, `reference`, `run_on` and (with Ascend output)
//! `ascend_module` with the graph's inputs as `&Tensor` parameters. What differs is said by
//! `Entries`: where each graph parameter comes from (an input, or a weight the ONNX module
//! reads from the model file), and whether the build made Ascend kernels.
//!
//! The `unsafe` calls are the build's descriptor functions, named by the graph's hash: the
//! macro checks at compile time that build.rs made this exact graph, `Builder::onnx` writes
//! the module in the same build that compiles the kernels.

use proc_macro2::{Ident, TokenStream};
use quote::{format_ident, quote};

/// Where a graph parameter's tensor comes from in a call.
#[derive(Clone, Debug)]
pub enum Arg {
    /// The entry point's parameter of this name.
    Input(Ident),
    /// Weight `k` of the module's `weights()` (a `Builder::onnx` module).
    Weight(usize),
}

/// What the entry points of one fused module are made from.
#[derive(Clone, Debug)]
pub struct Entries {
    /// The exported descriptor functions of the fused and unfused builds.
    pub fused: String,
    pub unfused: String,
    /// The entry points' parameters, in order.
    pub inputs: Vec<Ident>,
    /// Every graph parameter, in order.
    pub args: Vec<Arg>,
    pub n_outputs: usize,
    /// Whether a single output is still returned as a one-element tuple.
    pub tuple_return: bool,
    /// Whether the build made Ascend kernels (`ascend_module`, `run_on(Device::Ascend(n))`).
    pub ascend: bool,
    /// The caches the graph writes in place (`&mut Tensor` parameters after the inputs), in
    /// `Graph::state` order.
    pub state: Vec<Ident>,
    /// The dims the caller gives (`usize` parameters, last), in order.
    pub call_dims: Vec<Ident>,
}

impl Entries {
    /// The return type of every entry point.
    pub fn ret(&self) -> TokenStream {
        if self.tuple_return {
            let ts = (0..self.n_outputs).map(|_| quote!(::autofusion::Tensor));
            quote!((#(#ts,)*))
        } else {
            quote!(::autofusion::Tensor)
        }
    }

    fn params(&self) -> impl Iterator<Item = TokenStream> + '_ {
        let inputs = self.inputs.iter().map(|p| quote!(#p: &::autofusion::Tensor));
        let state = self.state.iter().map(|p| quote!(#p: &mut ::autofusion::Tensor));
        let dims = self.call_dims.iter().map(|p| quote!(#p: usize));
        inputs.chain(state).chain(dims)
    }

    fn stateful(&self) -> bool {
        !self.state.is_empty() || !self.call_dims.is_empty()
    }

    /// `module.run(__args)`, or with the caches and caller dims for a graph that keeps state
    /// (`method` is `run` or `reference`).
    pub fn call(&self, module: TokenStream, method: &str) -> TokenStream {
        if self.stateful() {
            let m = format_ident!("{}_with_state", method);
            quote!(#module.#m(__args, &mut __state, __dims))
        } else {
            let m = format_ident!("{}", method);
            quote!(#module.#m(__args))
        }
    }

    /// The caches and caller dims of a call, bound for `call`'s stateful form.
    fn state_bindings(&self) -> TokenStream {
        if !self.stateful() {
            return quote!();
        }
        let state = &self.state;
        let names = self.call_dims.iter().map(|d| d.to_string());
        let dims = &self.call_dims;
        let n = proc_macro2::Literal::usize_unsuffixed(state.len());
        quote! {
            let mut __state: [&mut ::autofusion::Tensor; #n] = [#(#state),*];
            let __dims: &[(&str, i64)] = &[#((#names, ::autofusion::__private::dim_value(#dims)?)),*];
        }
    }

    fn has_weights(&self) -> bool {
        self.args.iter().any(|a| matches!(a, Arg::Weight(_)))
    }

    /// The inputs slice of a call: `&[x, &__w[0], ..]`.
    fn call_args(&self) -> TokenStream {
        let args = self.args.iter().map(|a| match a {
            Arg::Input(i) => quote!(#i),
            Arg::Weight(k) => {
                let k = proc_macro2::Literal::usize_unsuffixed(*k);
                quote!(&__w[#k])
            }
        });
        quote!(&[#(#args),*])
    }

    /// One entry point `name` with `extra` parameters before the inputs, whose body runs
    /// `call` (an expression of the inputs slice `__args`) and returns the outputs as typed.
    /// `module` qualifies the module-level items it calls (`name::` outside the module).
    pub fn entry(
        &self,
        attrs: TokenStream,
        vis: TokenStream,
        name: &Ident,
        extra: TokenStream,
        call: TokenStream,
    ) -> TokenStream {
        let (params, ret, args) = (self.params(), self.ret(), self.call_args());
        let fused = &self.fused;
        let outs: Vec<Ident> = (0..self.n_outputs).map(|i| format_ident!("__out{}", i)).collect();
        let n = proc_macro2::Literal::usize_unsuffixed(self.n_outputs);
        let result = if self.tuple_return { quote!((#(#outs,)*)) } else { quote!(#(#outs)*) };
        let weights = if self.has_weights() { quote!(let __w = weights()?;) } else { quote!() };
        let state = self.state_bindings();
        // Caller dims keep their names from the graph (`P`).
        let allow = if self.stateful() {
            quote!(#[allow(clippy::too_many_arguments, non_snake_case)])
        } else {
            quote!(#[allow(clippy::too_many_arguments)])
        };
        quote! {
            #attrs
            #allow
            #vis fn #name(#extra #(#params),*) -> ::autofusion::Result<#ret> {
                #weights
                #state
                let __args: &[&::autofusion::Tensor] = #args;
                let __v = #call?;
                let [#(#outs),*]: [::autofusion::Tensor; #n] = ::autofusion::__private::outputs(__v, #fused)?;
                Ok(#result)
            }
        }
    }

    /// The items inside the module: the build's descriptor functions bound, `module()` and
    /// `unfused_module()`, the Ascend launchers when there are any, and the `unfused`,
    /// `reference` and `run_on` entry points.
    pub fn module_items(&self) -> TokenStream {
        let (fused, unfused) = (&self.fused, &self.unfused);
        let (fused_sym, unfused_sym) = (format_ident!("{}", fused), format_ident!("{}", unfused));
        let fused_doc = " The fused kernels (plan, kernel list, per-shape launch plans).";
        let unfused_doc = " The opt_level 0 build: one kernel per op (the fair unfused baseline).";
        let (ascend_items, ascend_arg) = self.ascend_items();
        let pubv = quote!(pub);
        let unfused_fn = self.entry(
            quote!(#[doc = " Run with one kernel per op (opt_level 0)."]),
            pubv.clone(),
            &format_ident!("unfused"),
            quote!(),
            self.call(quote!(unfused_module()?), "run"),
        );
        let run_on = self.entry(
            quote! {
                #[doc = " Run on `device` (`Device::Cpu`, or `Device::Ascend(n)` when built with the"]
                #[doc = " `ascend` feature; without it that device returns an error saying so)."]
            },
            pubv.clone(),
            &format_ident!("run_on"),
            quote!(device: ::autofusion::Device,),
            if self.stateful() {
                quote!(::autofusion::__private::run_on_with_state(device, &module, #ascend_arg __args, &mut __state, __dims))
            } else {
                quote!(::autofusion::__private::run_on(device, &module, #ascend_arg __args))
            },
        );
        let reference = self.entry(
            quote! {
                #[doc = " Run op by op in the reference interpreter (the test oracle: every"]
                #[doc = " intermediate materialised, for checking, not speed)."]
            },
            pubv,
            &format_ident!("reference"),
            quote!(),
            self.call(quote!(module()?), "reference"),
        );
        quote! {
            extern "C" {
                fn #fused_sym() -> *const ::autofusion::__private::AfModule;
                fn #unfused_sym() -> *const ::autofusion::__private::AfModule;
            }

            #[doc = #fused_doc]
            pub fn module() -> ::autofusion::Result<&'static ::autofusion::__private::Module> {
                static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::Module> = ::autofusion::__private::OnceCell::new();
                unsafe { ::autofusion::__private::load(&CELL, #fused_sym(), #fused) }
            }

            #[doc = #unfused_doc]
            pub fn unfused_module() -> ::autofusion::Result<&'static ::autofusion::__private::Module> {
                static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::Module> = ::autofusion::__private::OnceCell::new();
                unsafe { ::autofusion::__private::load(&CELL, #unfused_sym(), #unfused) }
            }

            #ascend_items

            #unfused_fn

            #reference

            #run_on
        }
    }

    /// With Ascend output: the launcher and metadata functions bound and `ascend_module()`,
    /// and the `run_on` argument passing it; otherwise nothing.
    fn ascend_items(&self) -> (TokenStream, TokenStream) {
        if !self.ascend {
            return (quote!(), quote!());
        }
        let fused = &self.fused;
        let launch = format_ident!("{}_launch", fused);
        let json = format_ident!("{}_ascend_json", fused);
        let items = quote! {
            extern "C" {
                fn #launch(kernel: u32, block_dim: u32, stream: *mut ::core::ffi::c_void, args: *mut u8, tilings: *mut u8, workspace: *mut u8) -> i32;
                fn #json() -> *const ::core::ffi::c_char;
            }

            /// The fused variant's Ascend C kernels (feature `ascend`).
            pub fn ascend_module() -> ::autofusion::Result<&'static ::autofusion::__private::AscendModule> {
                static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::AscendModule> = ::autofusion::__private::OnceCell::new();
                ::autofusion::__private::load_ascend(&CELL, module()?, #launch, #json, #fused)
            }
        };
        (items, quote!(&ascend_module,))
    }
}
