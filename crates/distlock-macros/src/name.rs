//! The lock name's format string: `"concert:{req.concert_id}"` becomes
//! `format!("concert:{}", req.concert_id)`, each placeholder checked against the function's
//! arguments.

use proc_macro2::{Span, TokenStream};
use quote::{ToTokens, quote_spanned};
use syn::{FnArg, LitStr, Pat, Signature};

/// A checked lock name: the format string `format!` gets, and its arguments.
pub(crate) struct NameFormat {
    /// The format string with every placeholder's path taken out (`{}`, `{:04}`).
    pub(crate) format: LitStr,
    /// One expression per placeholder, in order, spanned at the name literal.
    pub(crate) args: Vec<TokenStream>,
}

/// The names a placeholder's first identifier may be: the function's argument names, and
/// `self` for a method.
pub(crate) fn argument_names(signature: &Signature) -> Vec<String> {
    let mut names = Vec::new();
    for input in &signature.inputs {
        match input {
            FnArg::Receiver(_) => names.push("self".to_owned()),
            FnArg::Typed(typed) => bound_names(&typed.pat, &mut names),
        }
    }
    names
}

/// The identifiers a parameter pattern binds.
fn bound_names(pattern: &Pat, names: &mut Vec<String>) {
    match pattern {
        Pat::Ident(ident) => names.push(ident.ident.to_string()),
        Pat::Reference(reference) => bound_names(&reference.pat, names),
        Pat::Paren(paren) => bound_names(&paren.pat, names),
        Pat::Type(typed) => bound_names(&typed.pat, names),
        Pat::Tuple(tuple) => tuple.elems.iter().for_each(|pat| bound_names(pat, names)),
        Pat::TupleStruct(tuple) => tuple.elems.iter().for_each(|pat| bound_names(pat, names)),
        Pat::Slice(slice) => slice.elems.iter().for_each(|pat| bound_names(pat, names)),
        Pat::Struct(structure) => structure
            .fields
            .iter()
            .for_each(|field| bound_names(&field.pat, names)),
        _ => {}
    }
}

/// Parses `literal`, checking that every placeholder starts with one of `arguments`.
pub(crate) fn parse(literal: &LitStr, arguments: &[String]) -> syn::Result<NameFormat> {
    let span = literal.span();
    let error = |message: String| syn::Error::new(span, message);
    let text = literal.value();
    let mut format = String::with_capacity(text.len());
    let mut args = Vec::new();
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                format.push_str("{{");
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                format.push_str("}}");
            }
            '}' => {
                return Err(error(
                    "unmatched `}` in lock name: write `}}` for a literal brace".to_owned(),
                ));
            }
            '{' => {
                let mut placeholder = String::new();
                loop {
                    match chars.next() {
                        Some('}') => break,
                        Some(c) => placeholder.push(c),
                        None => {
                            return Err(error(
                                "unclosed `{` in lock name: close it with `}`, or write `{{` for a literal brace"
                                    .to_owned(),
                            ));
                        }
                    }
                }
                let (path, spec) = match placeholder.split_once(':') {
                    Some((path, spec)) => (path, Some(spec)),
                    None => (placeholder.as_str(), None),
                };
                args.push(placeholder_expr(path, arguments, span)?);
                format.push('{');
                if let Some(spec) = spec {
                    format.push(':');
                    format.push_str(spec);
                }
                format.push('}');
            }
            c => format.push(c),
        }
    }
    Ok(NameFormat {
        format: LitStr::new(&format, span),
        args,
    })
}

/// The expression a placeholder's path names (`req.concert_id`), spanned at the literal.
fn placeholder_expr(path: &str, arguments: &[String], span: Span) -> syn::Result<TokenStream> {
    let mut parts = path.split('.');
    let root = parts.next().unwrap_or_default();
    if root.is_empty() {
        return Err(syn::Error::new(
            span,
            "empty placeholder in lock name: name an argument, as `{id}` or `{req.id}`",
        ));
    }
    if !arguments.iter().any(|argument| argument == root) {
        let known = if arguments.is_empty() {
            "the function has no arguments".to_owned()
        } else {
            format!("the function's arguments are: {}", arguments.join(", "))
        };
        return Err(syn::Error::new(
            span,
            format!("unknown argument `{root}` in lock name; {known}"),
        ));
    }
    let mut expr = if root == "self" {
        syn::token::SelfValue(span).into_token_stream()
    } else {
        syn::Ident::new(root, span).into_token_stream()
    };
    for field in parts {
        let member = if !field.is_empty() && field.bytes().all(|b| b.is_ascii_digit()) {
            field
                .parse::<u32>()
                .ok()
                .map(|index| syn::Member::Unnamed(syn::Index { index, span }))
        } else {
            syn::parse_str::<syn::Ident>(field)
                .ok()
                .map(|ident| syn::Member::Named(syn::Ident::new(&ident.to_string(), span)))
        };
        let Some(member) = member else {
            return Err(syn::Error::new(
                span,
                format!(
                    "`{path}` in lock name is not an argument or a field path: write `{{arg}}` or `{{arg.field}}`"
                ),
            ));
        };
        expr = quote_spanned!(span=> #expr.#member);
    }
    Ok(expr)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Vec<String> {
        vec!["self".into(), "req".into(), "id".into()]
    }

    fn format_of(text: &str) -> syn::Result<(String, Vec<String>)> {
        let parsed = parse(&LitStr::new(text, Span::call_site()), &names())?;
        let args = parsed
            .args
            .iter()
            .map(|a| a.to_string().replace(' ', ""))
            .collect();
        Ok((parsed.format.value(), args))
    }

    #[test]
    fn placeholders_become_arguments() {
        let (format, args) =
            format_of("concert:{req.concert_id}/{id:04}/{self.shard}/{req.0}").unwrap();
        assert_eq!(format, "concert:{}/{:04}/{}/{}");
        assert_eq!(args, ["req.concert_id", "id", "self.shard", "req.0"]);
    }

    #[test]
    fn escapes_stay() {
        let (format, args) = format_of("a{{b}}c").unwrap();
        assert_eq!(format, "a{{b}}c");
        assert!(args.is_empty());
    }

    #[test]
    fn refusals() {
        let unknown = format_of("x:{foo}").err().unwrap().to_string();
        assert_eq!(
            unknown,
            "unknown argument `foo` in lock name; the function's arguments are: self, req, id"
        );
        for bad in ["{", "}", "{}", "{id", "{req.}", "{req.a-b}", "{ id}"] {
            assert!(format_of(bad).is_err(), "{bad:?}");
        }
    }
}
