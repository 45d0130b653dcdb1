//! The `#[locked(...)]` attribute of [distlock](https://docs.rs/distlock): it runs an
//! `async fn`'s body under a distributed mutex.
//!
//! Use it through `distlock::locked` (the `macros` feature of distlock, on by default); the
//! expansion names `::distlock`, so this crate is of no use alone. distlock's docs for
//! `locked` and its page `docs/locked.md` describe the options, the errors and what happens
//! when the lock is lost.
//!
//! What the attribute writes, for
//! `#[locked(locks = self.locks, name = "concert:{req.concert_id}", wait = "5s", token = t)]`
//! on `async fn order(&self, req: Order) -> Result<Receipt, AppError>`:
//!
//! 1. the name, `format!("concert:{}", req.concert_id)`, before anything else;
//! 2. the mutex, `distlock::Locks::mutex(&(self.locks), name)`, whose error returns at once
//!    through `From`;
//! 3. the body, moved into `mutex.run_with(AcquireOptions::new().wait(5 s), move |t| async
//!    move { body })`, whose error (a timeout, a loss, a release that found the lock gone)
//!    is returned through `From`, and whose value, the body's own `Result`, is returned as is.
//!
//! Every mistake the macro can see is a compile error at the option it concerns: a missing
//! `locks` or `name`, an unknown or repeated option, a placeholder that names no argument, a
//! duration it cannot read, `busy = "fail"` with a `wait`, a function that is not `async` or
//! returns nothing.

mod duration;
mod name;
mod options;

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::{format_ident, quote, quote_spanned};
use syn::spanned::Spanned;
use syn::visit_mut::VisitMut;
use syn::{AttrStyle, ItemFn, ReturnType};

use crate::options::Options;

/// Runs the body of an `async fn` under the distlock mutex its options name; see
/// `distlock::locked`, through which it is used.
#[proc_macro_attribute]
pub fn locked(attribute: TokenStream, item: TokenStream) -> TokenStream {
    let attribute_span = Span::call_site();
    match expand(attribute.into(), item.into(), attribute_span) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.into_compile_error().into(),
    }
}

/// The function, rewritten.
fn expand(
    attribute: proc_macro2::TokenStream,
    item: proc_macro2::TokenStream,
    attribute_span: Span,
) -> syn::Result<proc_macro2::TokenStream> {
    let function: ItemFn = syn::parse2(item)?;
    let options = Options::parse(attribute, attribute_span)?;
    let signature = &function.sig;
    if signature.asyncness.is_none() {
        return Err(syn::Error::new(
            signature.fn_token.span,
            "#[locked] needs an `async fn`: the body runs after the lock is acquired, which is awaited",
        ));
    }
    let ReturnType::Type(_, return_type) = &signature.output else {
        return Err(syn::Error::new(
            signature.ident.span(),
            "#[locked] needs the function to return a `Result<T, E>` whose `E: From<distlock::Error>` (or a `distlock::Result<T>`): acquiring and losing the lock are errors",
        ));
    };
    let arguments = name::argument_names(signature);
    let name = name::parse(&options.name, &arguments)?;

    let (outer, inner): (Vec<_>, Vec<_>) = function
        .attrs
        .iter()
        .partition(|attribute| matches!(attribute.style, AttrStyle::Outer));
    let visibility = &function.vis;
    let statements = &function.block.stmts;

    let name_var = format_ident!("__distlock_name", span = Span::mixed_site());
    let mutex_var = format_ident!("__distlock_mutex", span = Span::mixed_site());
    let outcome_var = format_ident!("__distlock_outcome", span = Span::mixed_site());
    let format = &name.format;
    let format_args = &name.args;
    let name_span = options.name.span();
    let name_stmt = quote_spanned! {name_span=>
        #[allow(clippy::useless_format)]
        let #name_var: ::std::string::String = ::std::format!(#format #(, #format_args)*);
    };

    let locks = &options.locks;
    let result_span = return_type.span();
    // `impl Trait` may not annotate a `let`: it becomes `_` there (the rest of the type,
    // `Result<_, E>`, still fixes the error type that `?` converts to).
    let mut annotated = (**return_type).clone();
    InferImplTrait.visit_type_mut(&mut annotated);
    let make_mutex = quote_spanned! {locks.span()=>
        ::distlock::Locks::mutex(&(#locks), #name_var)
    };

    let mut acquire_options = quote!(::distlock::AcquireOptions::new());
    if options.fail_when_busy {
        acquire_options = quote!(#acquire_options.wait(::core::time::Duration::ZERO));
    }
    if let Some(wait) = &options.wait {
        acquire_options = quote!(#acquire_options.wait(#wait));
    }
    if let Some(lease) = &options.lease {
        acquire_options = quote!(#acquire_options.lease(#lease));
    }
    let token = match &options.token {
        Some(token) => quote!(#token),
        None => quote!(_),
    };

    // One conversion of every distlock error, so that a wrong return type is one error.
    // The mutex is made in a statement of its own, so that the temporaries of the `locks`
    // expression (a `MutexGuard`, say) are dropped before the first await.
    let run = quote_spanned! {result_span=>
        let #mutex_var = #make_mutex;
        let #outcome_var = match #mutex_var {
            ::core::result::Result::Ok(#mutex_var) => {
                #mutex_var
                    .run_with(#acquire_options, move |#token: u64| async move {
                        // Fixes the block's output to the function's return type, so that `?`
                        // and `return` in the body mean what they mean in the function.
                        #[allow(unreachable_code, clippy::empty_loop, clippy::diverging_sub_expression)]
                        if false {
                            let __distlock_never: #annotated = loop {};
                            return __distlock_never;
                        }
                        #(#statements)*
                    })
                    .await
            }
            ::core::result::Result::Err(error) => ::core::result::Result::Err(error),
        };
        match #outcome_var {
            ::core::result::Result::Ok(value) => value,
            // `E` may be `distlock::Error` itself.
            #[allow(clippy::useless_conversion)]
            ::core::result::Result::Err(error) => {
                ::core::result::Result::Err(::core::convert::From::from(error))
            }
        }
    };

    Ok(quote! {
        #(#outer)*
        #visibility #signature {
            #(#inner)*
            #name_stmt
            #run
        }
    })
}

/// Replaces every `impl Trait` in a type with `_`.
struct InferImplTrait;

impl VisitMut for InferImplTrait {
    fn visit_type_mut(&mut self, ty: &mut syn::Type) {
        if let syn::Type::ImplTrait(found) = ty {
            let underscore_token = syn::Token![_](found.impl_token.span);
            *ty = syn::Type::Infer(syn::TypeInfer { underscore_token });
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }
}
