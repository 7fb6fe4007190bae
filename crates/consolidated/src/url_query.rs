//! Taking parameters out of a database URL's query before the driver reads the rest:
//! the TLS settings each backend reads itself (`postgres::tls`, `mysql::tls`).

/// The URL without the query parameters `names` lists, and the value of each one found
/// (its last, percent-decoded), in the order of `names`.
pub fn take_parameters(url: &str, names: &[&str]) -> (String, Vec<Option<String>>) {
    let mut found = vec![None; names.len()];
    let Some((base, query)) = url.split_once('?') else {
        return (url.to_string(), found);
    };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            match names.iter().position(|wanted| *wanted == name) {
                Some(index) => {
                    found[index] = Some(percent_decoded(value));
                    false
                }
                None => true,
            }
        })
        .collect();
    let rest = match kept.is_empty() {
        true => base.to_string(),
        false => format!("{base}?{}", kept.join("&")),
    };
    (rest, found)
}

/// `%2F` and the like in a value given as a URL parameter.
fn percent_decoded(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = bytes
            .get(index + 1..index + 3)
            .and_then(|hex| std::str::from_utf8(hex).ok())
            .and_then(|hex| u8::from_str_radix(hex, 16).ok());
        match (bytes[index], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                index += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                index += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_parameters_leave_the_url_decoded_and_the_rest_stays() {
        let (rest, found) = take_parameters(
            "postgres://u:p@db/app?sslmode=verify-full&application_name=x&sslrootcert=%2Fetc%2Fca.pem",
            &["sslmode", "sslrootcert"],
        );
        assert_eq!(rest, "postgres://u:p@db/app?application_name=x");
        assert_eq!(
            found,
            [Some("verify-full".into()), Some("/etc/ca.pem".into())]
        );
        let (rest, found) = take_parameters("postgres://db/app", &["sslmode"]);
        assert_eq!((rest.as_str(), found), ("postgres://db/app", vec![None]));
    }
}
