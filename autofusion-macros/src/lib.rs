//! `#[fused_graph]`: a thin proc macro over `autofusion-compiler`. It parses and checks the
//! graph (reporting every error of a phase at once, spanned on the offending tokens) and emits
//! the Rust glue: input validation and launch through the runtime, `reference` and `unfused`
//! entry points, and a compile-time check that build.rs compiled this exact graph.

use autofusion_compiler::{env_var, Unit, Variant};
use proc_macro::TokenStream;
use quote::{format_ident, quote};

/// Compile a Transformer layer written in the autofusion DSL into fused kernels.
///
/// See the `autofusion` crate for the DSL and options.
#[proc_macro_attribute]
pub fn fused_graph(attr: TokenStream, item: TokenStream) -> TokenStream {
    let item_fn: syn::ItemFn = match syn::parse(item) {
        Ok(f) => f,
        Err(e) => return e.to_compile_error().into(),
    };
    match Unit::parse(attr.into(), &item_fn) {
        Ok(unit) => expand(&unit, &item_fn).into(),
        Err(d) => d.to_syn().to_compile_error().into(),
    }
}

fn expand(unit: &Unit, f: &syn::ItemFn) -> proc_macro2::TokenStream {
    let glue = Glue::new(unit, f);
    let top = top_level_fn(&glue, unit, f);
    let module = entry_module(&glue);
    quote! {
        #top

        #module
    }
}

/// What the generated items share: the graph's name, parameters, return type, hash and
/// build-output symbols.
struct Glue<'a> {
    vis: &'a syn::Visibility,
    name: &'a syn::Ident,
    params: Vec<syn::Ident>,
    ret: proc_macro2::TokenStream,
    hash: &'a str,
    /// The variable build.rs sets to the hash it compiled.
    env: String,
    fused_sym: syn::Ident,
    unfused_sym: syn::Ident,
    fused_str: String,
    unfused_str: String,
    /// The error when build.rs compiled another version of the graph.
    stale: String,
    /// Destructures the runtime's output vector `__v` into `__out0, ..`.
    convert: proc_macro2::TokenStream,
    /// The outputs as the function returns them.
    result: proc_macro2::TokenStream,
}

impl<'a> Glue<'a> {
    /// The names, types and symbols of `unit`, the graph `f` defines.
    fn new(unit: &'a Unit, f: &'a syn::ItemFn) -> Glue<'a> {
        let name = &f.sig.ident;
        let sig = &unit.lowered.sig;
        let params: Vec<syn::Ident> =
            sig.params.iter().map(|(n, _, _)| format_ident!("{}", n)).collect();
        let n_out = sig.outputs.len();
        let ret = if sig.tuple_return {
            let ts = (0..n_out).map(|_| quote!(::autofusion::Tensor));
            quote!((#(#ts,)*))
        } else {
            quote!(::autofusion::Tensor)
        };
        let outs: Vec<syn::Ident> = (0..n_out).map(|i| format_ident!("__out{}", i)).collect();
        let fused_sym = format_ident!("{}", unit.symbol(Variant::Fused));
        let unfused_sym = format_ident!("{}", unit.symbol(Variant::Unfused));
        let fused_str = fused_sym.to_string();
        let unfused_str = unfused_sym.to_string();
        let stale = format!(
            "graph `{name}` changed since build.rs compiled it: build.rs must list the file that defines it (`Builder::file`), and no two graphs of the crate may share the name `{name}`"
        );
        let convert = quote! {
            let [#(#outs),*]: [::autofusion::Tensor; #n_out] = ::autofusion::__private::outputs(__v, #fused_str)?;
        };
        let result = if sig.tuple_return { quote!((#(#outs,)*)) } else { quote!(#(#outs)*) };
        Glue {
            vis: &f.vis,
            name,
            params,
            ret,
            hash: &unit.hash,
            env: env_var(&name.to_string()),
            fused_sym,
            unfused_sym,
            fused_str,
            unfused_str,
            stale,
            convert,
            result,
        }
    }

    /// The parameter list of every entry point: each parameter as `&Tensor`.
    fn params_ty(&self) -> impl Iterator<Item = proc_macro2::TokenStream> + Clone + '_ {
        self.params.iter().map(|p| quote!(#p: &::autofusion::Tensor))
    }
}

/// The function as written, now running the fused kernels (with its docs and input shapes).
fn top_level_fn(glue: &Glue, unit: &Unit, f: &syn::ItemFn) -> proc_macro2::TokenStream {
    let Glue { vis, name, params, ret, hash, convert, result, .. } = glue;
    let attrs: Vec<&syn::Attribute> = f.attrs.iter().filter(|a| a.path().is_ident("doc")).collect();
    let shapes: Vec<String> = unit
        .lowered
        .sig
        .params
        .iter()
        .map(|(n, d, s)| format!("`{n}`: {d}{}", autofusion_compiler::dim::shape_str(s)))
        .collect();
    let doc = format!("Fused graph `{name}` (plan {hash}). Inputs: {}.", shapes.join(", "));
    let params_ty = glue.params_ty();
    quote! {
        #(#attrs)*
        #[doc = #doc]
        #[allow(clippy::too_many_arguments)]
        #vis fn #name(#(#params_ty),*) -> ::autofusion::Result<#ret> {
            let __v = #name::module()?.run(&[#(#params),*])?;
            #convert
            Ok(#result)
        }
    }
}

/// The module named after the graph: its hash, the check that build.rs compiled it, the
/// fused and unfused modules, and the `unfused`, `run_on` and `reference` entry points.
fn entry_module(glue: &Glue) -> proc_macro2::TokenStream {
    let Glue { vis, name, params, ret, hash, env, stale, convert, result, .. } = glue;
    let Glue { fused_sym, unfused_sym, fused_str, unfused_str, .. } = glue;
    let missing = format!(
        "graph `{name}` has no build output: add `autofusion_build::Builder::new().file(\"FILE\").compile(\"fused\");` to build.rs (and `autofusion-build` to [build-dependencies])"
    );
    let (pre, post) = missing.split_once("FILE").unwrap();
    let params_ty2 = glue.params_ty();
    let params_ty3 = params_ty2.clone();
    let params_ty4 = params_ty2.clone();
    let (ascend_items, ascend_arg) = ascend_items(glue);
    quote! {
        #[doc = concat!("Build output and alternative entry points of the fused graph `", stringify!(#name), "`.")]
        #[allow(non_snake_case)]
        #vis mod #name {
            /// Content hash of the graph and its options (keys the build output).
            pub const HASH: &str = #hash;

            const _: () = match ::core::option_env!(#env) {
                ::core::option::Option::None => ::core::panic!(::core::concat!(#pre, ::core::file!(), #post)),
                ::core::option::Option::Some(__h) => {
                    if !::autofusion::__private::str_eq(__h, #hash) {
                        ::core::panic!(#stale)
                    }
                }
            };

            extern "C" {
                fn #fused_sym() -> *const ::autofusion::__private::AfModule;
                fn #unfused_sym() -> *const ::autofusion::__private::AfModule;
            }

            /// The fused kernels (plan, kernel list, per-shape launch plans).
            pub fn module() -> ::autofusion::Result<&'static ::autofusion::__private::Module> {
                static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::Module> = ::autofusion::__private::OnceCell::new();
                // SAFETY: the descriptor function of this graph's fused build, named by its hash.
                unsafe { ::autofusion::__private::load(&CELL, #fused_sym(), #fused_str) }
            }

            /// The opt_level 0 build: one kernel per op (the fair unfused baseline).
            pub fn unfused_module() -> ::autofusion::Result<&'static ::autofusion::__private::Module> {
                static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::Module> = ::autofusion::__private::OnceCell::new();
                // SAFETY: the descriptor function of this graph's unfused build, named by its hash.
                unsafe { ::autofusion::__private::load(&CELL, #unfused_sym(), #unfused_str) }
            }

            /// Run the graph with one kernel per op (opt_level 0).
            #[allow(clippy::too_many_arguments)]
            pub fn unfused(#(#params_ty2),*) -> ::autofusion::Result<#ret> {
                let __v = unfused_module()?.run(&[#(#params),*])?;
                #convert
                Ok(#result)
            }

            #ascend_items

            /// Run on `device` (`Device::Cpu`, or `Device::Ascend(n)` when built with the
            /// `ascend` feature; without it that device returns an error saying so).
            #[allow(clippy::too_many_arguments)]
            pub fn run_on(device: ::autofusion::Device, #(#params_ty4),*) -> ::autofusion::Result<#ret> {
                let __v = ::autofusion::__private::run_on(device, &module, #ascend_arg &[#(#params),*])?;
                #convert
                Ok(#result)
            }

            #[allow(clippy::too_many_arguments)]
            /// Run the unfused graph op by op in the reference interpreter (the test oracle:
            /// every intermediate materialised, for checking, not speed).
            pub fn reference(#(#params_ty3),*) -> ::autofusion::Result<#ret> {
                let __v = module()?.reference(&[#(#params),*])?;
                #convert
                Ok(#result)
            }
        }
    }
}

/// With the `ascend` feature: the items binding the graph's Ascend C launchers (and the check
/// that build.rs built them), and the `run_on` argument that passes them; without it, nothing.
fn ascend_items(glue: &Glue) -> (proc_macro2::TokenStream, proc_macro2::TokenStream) {
    let Glue { name, hash, env, stale, fused_sym, fused_str, .. } = glue;
    // With the `ascend` feature the build script also compiled the graph's Ascend C; bind its
    // launchers and check that it did.
    if !cfg!(feature = "ascend") {
        return (quote!(), quote!());
    }
    let launch = format_ident!("{}_launch", fused_sym);
    let json = format_ident!("{}_ascend_json", fused_sym);
    let env_a = format!("{env}_ASCEND");
    let no_ascend = format!(
        "graph `{name}` has no Ascend build output: the `ascend` feature of autofusion is on, but build.rs did not build Ascend kernels; give the package an `ascend` feature that enables `autofusion/ascend` (build.rs sees CARGO_FEATURE_ASCEND), or call `Builder::ascend(true)`"
    );
    let items = quote! {
        // Checked only once the host output is there and current: otherwise the host check
        // has already said what is wrong, and one error is enough.
        const _: () = {
            let __host = match ::core::option_env!(#env) {
                ::core::option::Option::Some(__h) => ::autofusion::__private::str_eq(__h, #hash),
                ::core::option::Option::None => false,
            };
            if __host {
                match ::core::option_env!(#env_a) {
                    ::core::option::Option::None => ::core::panic!(#no_ascend),
                    ::core::option::Option::Some(__h) => {
                        if !::autofusion::__private::str_eq(__h, #hash) {
                            ::core::panic!(#stale)
                        }
                    }
                }
            }
        };

        extern "C" {
            fn #launch(kernel: u32, block_dim: u32, stream: *mut ::core::ffi::c_void, args: *mut u8, tilings: *mut u8, workspace: *mut u8) -> i32;
            fn #json() -> *const ::core::ffi::c_char;
        }

        /// The fused variant's Ascend C kernels (feature `ascend`).
        pub fn ascend_module() -> ::autofusion::Result<&'static ::autofusion::__private::AscendModule> {
            static CELL: ::autofusion::__private::OnceCell<::autofusion::__private::AscendModule> = ::autofusion::__private::OnceCell::new();
            ::autofusion::__private::load_ascend(&CELL, module()?, #launch, #json, #fused_str)
        }
    };
    (items, quote!(&ascend_module,))
}
