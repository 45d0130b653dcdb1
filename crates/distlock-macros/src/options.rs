//! The attribute's options: `locks = EXPR, name = "...", wait = ..., lease = ..., busy = ...,
//! token = IDENT`, parsed and checked.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, Ident, Lit, LitStr, Token};

use crate::duration;

/// Every option the attribute takes, in the order the docs list them.
const OPTION_NAMES: &str = "locks, name, wait, lease, busy, token";

/// The checked options of one `#[locked(...)]`.
pub(crate) struct Options {
    /// The expression giving the `Locks` (or a reference to one, or a smart pointer to one).
    pub(crate) locks: Expr,
    /// The lock name's format string.
    pub(crate) name: LitStr,
    /// The wait limit: a `Duration` expression.
    pub(crate) wait: Option<TokenStream>,
    /// The fixed lease: a `Duration` expression.
    pub(crate) lease: Option<TokenStream>,
    /// `busy = "fail"`: try once.
    pub(crate) fail_when_busy: bool,
    /// The identifier the body sees the fencing token as.
    pub(crate) token: Option<Ident>,
}

/// One `key = value` pair.
struct Pair {
    key: Ident,
    value: Expr,
}

impl Parse for Pair {
    fn parse(input: ParseStream<'_>) -> syn::Result<Self> {
        let key: Ident = input.parse().map_err(|error| {
            syn::Error::new(
                error.span(),
                format!(
                    "expected an option `key = value`, as `name = \"order:{{id}}\"`; #[locked] takes: {OPTION_NAMES}"
                ),
            )
        })?;
        if !input.peek(Token![=]) {
            return Err(syn::Error::new(
                key.span(),
                format!("expected `{key} = <value>`: every #[locked] option takes a value"),
            ));
        }
        input.parse::<Token![=]>()?;
        let value = input.parse()?;
        Ok(Pair { key, value })
    }
}

impl Options {
    /// Parses the attribute's arguments; `attribute` is where errors about a missing option
    /// point.
    pub(crate) fn parse(tokens: TokenStream, attribute: Span) -> syn::Result<Options> {
        let pairs =
            syn::parse::Parser::parse2(Punctuated::<Pair, Token![,]>::parse_terminated, tokens)?;
        let mut locks = None;
        let mut name = None;
        let mut wait = None;
        let mut lease = None;
        let mut busy: Option<(bool, Span)> = None;
        let mut token = None;
        let mut seen: Vec<String> = Vec::new();
        for Pair { key, value } in pairs {
            let key_name = key.to_string();
            if seen.contains(&key_name) {
                return Err(syn::Error::new(
                    key.span(),
                    format!("duplicate option `{key_name}`: give each #[locked] option once"),
                ));
            }
            match key_name.as_str() {
                "locks" => locks = Some(value),
                "name" => name = Some(string_literal(&value, "name", "\"order:{id}\"")?),
                "wait" => wait = Some((duration_expr(value, "wait")?, key.span())),
                "lease" => lease = Some(duration_expr(value, "lease")?),
                "busy" => {
                    let literal = string_literal(&value, "busy", "\"wait\" or \"fail\"")?;
                    let fail = match literal.value().as_str() {
                        "wait" => false,
                        "fail" => true,
                        other => {
                            return Err(syn::Error::new(
                                literal.span(),
                                format!(
                                    "unknown `busy` value {other:?}: write \"wait\" (wait for the lock, the default) or \"fail\" (try once)"
                                ),
                            ));
                        }
                    };
                    busy = Some((fail, key.span()));
                }
                "token" => token = Some(identifier(&value)?),
                _ => {
                    return Err(syn::Error::new(
                        key.span(),
                        format!("unknown option `{key_name}`; #[locked] takes: {OPTION_NAMES}"),
                    ));
                }
            }
            seen.push(key_name);
        }
        let fail_when_busy = busy.is_some_and(|(fail, _)| fail);
        if let (true, Some((_, wait_span))) = (fail_when_busy, &wait) {
            return Err(syn::Error::new(
                *wait_span,
                "`busy = \"fail\"` tries once and never waits, so it takes no `wait`: remove one of the two",
            ));
        }
        let locks = locks.ok_or_else(|| {
            syn::Error::new(
                attribute,
                "#[locked] needs `locks = <expression giving a distlock::Locks>`, as `locks = self.locks`",
            )
        })?;
        let name = name.ok_or_else(|| {
            syn::Error::new(
                attribute,
                "#[locked] needs `name = \"...\"`: the lock's name, whose `{arg}` placeholders name the function's arguments, as `name = \"order:{id}\"`",
            )
        })?;
        Ok(Options {
            locks,
            name,
            wait: wait.map(|(expr, _)| expr),
            lease,
            fail_when_busy,
            token,
        })
    }
}

/// The string literal an option takes.
fn string_literal(value: &Expr, option: &str, example: &str) -> syn::Result<LitStr> {
    match value {
        Expr::Lit(syn::ExprLit {
            lit: Lit::Str(literal),
            ..
        }) => Ok(literal.clone()),
        _ => Err(syn::Error::new(
            value.span(),
            format!("`{option}` takes a string literal, as `{option} = {example}`"),
        )),
    }
}

/// A `wait` or `lease`: a string literal such as `"5s"`, parsed now, or any expression of
/// type `std::time::Duration`.
fn duration_expr(value: Expr, option: &str) -> syn::Result<TokenStream> {
    let Expr::Lit(syn::ExprLit {
        lit: Lit::Str(literal),
        ..
    }) = &value
    else {
        let span = value.span();
        let value = value.into_token_stream();
        return Ok(
            quote_spanned!(span=> { let duration: ::core::time::Duration = #value; duration }),
        );
    };
    let millis = duration::parse_millis(&literal.value()).map_err(|reason| {
        syn::Error::new(literal.span(), format!("bad `{option}` duration: {reason}"))
    })?;
    if millis == 0 && option == "lease" {
        return Err(syn::Error::new(
            literal.span(),
            "a `lease` of zero would end at once: give a positive duration, as \"30s\"",
        ));
    }
    Ok(quote_spanned!(literal.span()=> ::core::time::Duration::from_millis(#millis)))
}

/// The identifier `token = IDENT` binds.
fn identifier(value: &Expr) -> syn::Result<Ident> {
    if let Expr::Path(path) = value {
        if path.qself.is_none() && path.attrs.is_empty() {
            if let Some(ident) = path.path.get_ident() {
                return Ok(ident.clone());
            }
        }
    }
    Err(syn::Error::new(
        value.span(),
        "`token` takes an identifier, the name the body sees the fencing token (a `u64`) as: `token = fencing_token`",
    ))
}
