//! Backend URLs as backends read them: one or more hosts, user info,
//! a path and query options, and the durations they carry.

use crate::error::{Error, Result};

/// The URL with any password replaced by `***`, for logs and errors.
pub(crate) fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            mask_query(u.as_ref())
        }
        _ => redact_userinfo(url),
    }
}

/// `url` with the values of its query parameters that name a secret
/// (`?password=`, `sslpassword=`, `sentinel_password=`, `digest=user:pw`,
/// `token=`, `secret=`) as `***`; a `user:` before the secret is kept.
fn mask_query(url: &str) -> String {
    const SECRET: [&str; 6] = [
        "password",
        "passwd",
        "secret",
        "token",
        "digest",
        "credential",
    ];
    let Some((head, query)) = url.split_once('?') else {
        return url.to_owned();
    };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((k, v)) if SECRET.iter().any(|s| k.to_ascii_lowercase().contains(s)) => {
                // ZooKeeper's `digest=user:password` keeps its user.
                match v.split_once(':') {
                    Some((user, _)) if k.eq_ignore_ascii_case("digest") => {
                        format!("{k}={user}:***")
                    }
                    _ => format!("{k}=***"),
                }
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{head}?{}", pairs.join("&"))
}

/// A URL with one or more `host:port` pairs (`redis+cluster://h1:p1,h2:p2`,
/// `zk://h1,h2/chroot`), which `url::Url` does not parse. Written by hand
/// for that reason; user info and query are decoded with the `url` crate's
/// helpers.
#[cfg_attr(
    not(any(feature = "redis", feature = "etcd", feature = "zookeeper")),
    allow(dead_code)
)]
pub(crate) struct Endpoints {
    pub(crate) scheme: String,
    /// The user info exactly as written (still percent-encoded).
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) userinfo: Option<String>,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) hosts: Vec<(String, u16)>,
    /// The path after the hosts, without the leading `/`.
    pub(crate) path: String,
    query: Vec<(String, String)>,
    redacted: String,
}

#[cfg_attr(
    not(any(feature = "redis", feature = "etcd", feature = "zookeeper")),
    allow(dead_code)
)]
impl Endpoints {
    pub(crate) fn parse(url: &str, default_port: u16) -> Result<Endpoints> {
        let redacted = redact_userinfo(url);
        let bad = |what: String| Error::invalid(format!("{what} in backend URL {redacted:?}"));
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| bad("no `scheme://`".into()))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, q),
            None => (rest, ""),
        };
        let (authority, path) = match rest.split_once('/') {
            Some((a, p)) => (a, p),
            None => (rest, ""),
        };
        let (userinfo, hostlist) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|c| c.into_owned())
                .map_err(|_| bad("user info that is not UTF-8".into()))
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(u) => match u.split_once(':') {
                Some((n, p)) => (Some(decode(n)?).filter(|n| !n.is_empty()), Some(decode(p)?)),
                None => (Some(decode(u)?).filter(|n| !n.is_empty()), None),
            },
        };
        let mut hosts = Vec::new();
        for h in hostlist.split(',') {
            if h.is_empty() {
                return Err(bad("an empty host".into()));
            }
            let (host, port) = if let Some(v6) = h.strip_prefix('[') {
                let (host, after) = v6
                    .split_once(']')
                    .ok_or_else(|| bad(format!("an unclosed `[` in host {h:?}")))?;
                (host, after.strip_prefix(':'))
            } else {
                match h.rsplit_once(':') {
                    Some((host, port)) => (host, Some(port)),
                    None => (h, None),
                }
            };
            if host.is_empty() {
                return Err(bad(format!("no host name in {h:?}")));
            }
            let port =
                match port {
                    None => default_port,
                    Some(p) => p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(|| {
                        bad(format!("port {p:?} is not a number from 1 to 65535"))
                    })?,
                };
            hosts.push((host.to_owned(), port));
        }
        Ok(Endpoints {
            scheme: scheme.to_owned(),
            userinfo: userinfo.map(str::to_owned),
            user,
            password,
            hosts,
            path: path.to_owned(),
            query: url::form_urlencoded::parse(query.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
            redacted,
        })
    }

    /// The URL with its password hidden, for messages.
    pub(crate) fn redacted(&self) -> &str {
        &self.redacted
    }

    /// `host:port` of host `i`, with brackets for IPv6.
    pub(crate) fn addr(&self, i: usize) -> String {
        let (h, p) = &self.hosts[i];
        if h.contains(':') {
            format!("[{h}]:{p}")
        } else {
            format!("{h}:{p}")
        }
    }

    /// The query parameters nobody took yet, encoded for a URL.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn rest_query(&self) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .extend_pairs(&self.query)
            .finish()
    }

    /// Removes and returns every value of query parameter `key`.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn take_all(&mut self, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(v) = self.take(key) {
            out.push(v);
        }
        out
    }

    /// Removes and returns query parameter `key`.
    pub(crate) fn take(&mut self, key: &str) -> Option<String> {
        let i = self.query.iter().position(|(k, _)| k == key)?;
        Some(self.query.remove(i).1)
    }

    /// Takes `ca=FILE`, the PEM certificates of the authorities a TLS URL
    /// (`tls`: its scheme is `tls_scheme`) trusts instead of the webpki
    /// roots, and reads them; a `ca=` on a URL without TLS is refused, as it
    /// would change nothing.
    #[cfg_attr(not(any(feature = "redis", feature = "etcd")), allow(dead_code))]
    pub(crate) fn take_ca(&mut self, tls: bool, tls_scheme: &str) -> Result<Option<Vec<u8>>> {
        let Some(path) = self.take("ca") else {
            return Ok(None);
        };
        let url = &self.redacted;
        if !tls {
            return Err(Error::invalid(format!(
                "ca= in {url:?}: a CA file applies to TLS; use {tls_scheme}//"
            )));
        }
        let pem = std::fs::read(&path).map_err(|e| {
            Error::invalid(format!("ca={path:?} in {url:?}: cannot read it: {e}")).with_source(e)
        })?;
        if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
            return Err(Error::invalid(format!(
                "ca={path:?} in {url:?}: no PEM certificate in it (-----BEGIN CERTIFICATE-----)"
            )));
        }
        Ok(Some(pem))
    }

    /// Takes `key` as a duration (`250ms`, `2s`, `1m`, or bare milliseconds).
    pub(crate) fn take_duration(&mut self, key: &str) -> Result<Option<std::time::Duration>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        parse_duration(&v).map(Some).ok_or_else(|| {
            Error::invalid(format!(
                "{key}={v:?} in backend URL {:?} is not a duration like 500ms, 2s or 1m",
                self.redacted
            ))
        })
    }

    /// Takes `timeout=` (how long one request may take): a positive
    /// duration, [`DEFAULT_TIMEOUT`](crate::spi::DEFAULT_TIMEOUT) when
    /// absent.
    #[cfg_attr(
        not(any(feature = "redis", feature = "etcd", feature = "zookeeper")),
        allow(dead_code)
    )]
    pub(crate) fn take_timeout(&mut self) -> Result<std::time::Duration> {
        match self.take("timeout") {
            None => Ok(crate::spi::DEFAULT_TIMEOUT),
            Some(v) => parse_timeout(&v, &self.redacted),
        }
    }

    /// Takes `key` as a number.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn take_number<T: std::str::FromStr>(&mut self, key: &str) -> Result<Option<T>> {
        let Some(v) = self.take(key) else {
            return Ok(None);
        };
        v.parse().map(Some).map_err(|_| {
            Error::invalid(format!(
                "{key}={v:?} in backend URL {:?} is not a valid number",
                self.redacted
            ))
        })
    }

    /// Fails on query parameters nobody took, naming the known ones.
    pub(crate) fn finish(&self, known: &[&str]) -> Result<()> {
        match self.query.first() {
            None => Ok(()),
            Some((k, _)) => Err(Error::invalid(format!(
                "unknown parameter {k:?} in backend URL {:?}; {} URLs take: {}",
                self.redacted,
                self.scheme,
                known.join(", ")
            ))),
        }
    }
}

/// The `timeout=` of a URL (`label` names it in the error): a positive
/// duration.
#[cfg_attr(
    not(any(
        feature = "postgres",
        feature = "mysql",
        feature = "redis",
        feature = "etcd",
        feature = "zookeeper"
    )),
    allow(dead_code)
)]
pub(crate) fn parse_timeout(v: &str, label: &str) -> Result<std::time::Duration> {
    // An hour at most: a request timeout is multiplied and added to
    // instants, which must not overflow.
    const MAX: std::time::Duration = std::time::Duration::from_secs(3600);
    parse_duration(v)
        .filter(|t| !t.is_zero() && *t <= MAX)
        .ok_or_else(|| {
            Error::invalid(format!(
                "timeout={v:?} in {label:?}: a positive duration up to 1h, like 500ms or 5s"
            ))
        })
}

/// `250ms`, `2s`, `1m`, `1h` or bare milliseconds.
pub(crate) fn parse_duration(v: &str) -> Option<std::time::Duration> {
    use std::time::Duration;
    let v = v.trim();
    let split = v.find(|c: char| !c.is_ascii_digit()).unwrap_or(v.len());
    let (n, unit) = v.split_at(split);
    let n: u64 = n.parse().ok()?;
    match unit {
        "" | "ms" => Some(Duration::from_millis(n)),
        "s" => Some(Duration::from_secs(n)),
        "m" => Some(Duration::from_secs(n.checked_mul(60)?)),
        "h" => Some(Duration::from_secs(n.checked_mul(3600)?)),
        _ => None,
    }
}

/// Hides the password of a URL that `url::Url` may not parse (several hosts).
fn redact_userinfo(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return mask_query(url);
    };
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    mask_query(&match rest[..end].rsplit_once('@') {
        Some((user, _)) if user.contains(':') => {
            let name = user.split(':').next().unwrap_or("");
            format!("{scheme}://{name}:***@{}", &rest[user.len() + 1..])
        }
        _ => url.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::redact;

    #[test]
    fn secrets_in_the_query_are_hidden_too() {
        assert_eq!(
            redact("postgres://app@db/x?password=hunter2&pool=4"),
            "postgres://app@db/x?password=***&pool=4"
        );
        assert_eq!(
            redact("zk://h1:2181,h2:2181/app?digest=user:pw&session_timeout=10s"),
            "zk://h1:2181,h2:2181/app?digest=user:***&session_timeout=10s"
        );
        assert_eq!(
            redact("redis+sentinel://u:pw@h1,h2/mymaster?sentinel_password=x"),
            "redis+sentinel://u:***@h1,h2/mymaster?sentinel_password=***"
        );
        assert_eq!(
            redact("redis://:pw@h/0?timeout=5s"),
            "redis://:***@h/0?timeout=5s"
        );
        assert_eq!(redact("sqlite:///tmp/l.db"), "sqlite:///tmp/l.db");
        // Only a digest keeps the part before its `:`.
        assert_eq!(
            redact("postgres://h/x?password=ab:cd"),
            "postgres://h/x?password=***"
        );
    }
}
