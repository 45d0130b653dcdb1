//! The host list of a network URL (`host[:port],host2[:port]`): each server's name and port,
//! the scheme's default port where a server names none.

/// The servers `hosts` (the host list of `url`) names, with the default port of `url`'s
/// scheme (its [`Scheme::default_port`](super::Scheme::default_port)) where one names none.
/// `Err` says what is wrong, quoting a server only when it holds no user info (which may
/// carry a password; these schemes take none).
pub(crate) fn host_list<'a>(url: &str, hosts: &'a str) -> Result<Vec<(&'a str, u16)>, String> {
    let default_port = super::of_url(url)
        .ok()
        .and_then(|(scheme, _)| scheme.default_port)
        .ok_or("the scheme has no servers to name")?;
    if hosts.is_empty() {
        return Err("no server is named".to_owned());
    }
    hosts
        .split(',')
        .enumerate()
        .map(|(i, host)| {
            let server = || {
                let named = crate::redact::piece(url, host, || format!("{}", i + 1));
                format!("server {named}")
            };
            if host.contains('@') {
                return Err(
                    "a server has user info (user:password@), which this scheme \
                            does not take"
                        .to_owned(),
                );
            }
            let (name, port) = match host.rsplit_once(':') {
                Some((name, port)) => {
                    let port = port
                        .parse()
                        .ok()
                        .filter(|port| *port != 0)
                        .ok_or_else(|| format!("{} has a bad port", server()))?;
                    (name, port)
                }
                None => (host, default_port),
            };
            if name.is_empty() {
                return Err(format!("{} has no host name", server()));
            }
            Ok((name, port))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_server_with_its_port_or_the_default() {
        assert_eq!(
            host_list("zk://a,b:2,c:3/", "a,b:2,c:3"),
            Ok(vec![("a", 2181), ("b", 2), ("c", 3)])
        );
        assert_eq!(host_list("etcd://e/", "e"), Ok(vec![("e", 2379)]));
        assert_eq!(
            host_list("zk://a:x/", "a:x"),
            Err("server \"a:x\" has a bad port".to_owned())
        );
        for (hosts, says) in [
            ("", "no server"),
            ("a,:2", "no host name"),
            ("a:0", "bad port"),
            ("a:x", "bad port"),
            ("u:secret@a:1", "user info"),
            ("a,u:sec", "server 2 has a bad port"),
        ] {
            let error = host_list("zk://u:p@", hosts).unwrap_err();
            assert!(error.contains(says), "{hosts}: {error}");
            assert!(!error.contains("secret"), "{hosts}: {error}");
        }
    }
}
