//! Quoting for `bash -c` strings: one function for the CLI (joining a program and its arguments
//! into one command) and the local provider (the EXIT trap around a command).
//!
//! A word made only of characters the shell never interprets is left as it is, so what a user
//! sees stays readable (`cat notes.txt`); anything else is single-quoted, with each `'` written
//! as `'\''`.

/// Bytes that never need quoting.
fn is_safe(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"-_./=:,+@%".contains(&b)
}

/// `s` as one bash word.
pub fn quote_bytes(s: &[u8]) -> Vec<u8> {
    if !s.is_empty() && s.iter().all(|&b| is_safe(b)) {
        return s.to_vec();
    }
    let mut out = Vec::with_capacity(s.len() + 2);
    out.push(b'\'');
    for &b in s {
        if b == b'\'' {
            out.extend_from_slice(b"'\\''");
        } else {
            out.push(b);
        }
    }
    out.push(b'\'');
    out
}

/// `s` as one bash word.
pub fn quote(s: &str) -> String {
    String::from_utf8(quote_bytes(s.as_bytes()))
        .expect("quoting adds only ASCII bytes at character boundaries of UTF-8 text")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quotes_only_what_the_shell_would_interpret() {
        assert_eq!(quote("notes.txt"), "notes.txt");
        assert_eq!(quote("--flag=a,b"), "--flag=a,b");
        assert_eq!(quote(""), "''");
        assert_eq!(quote("a b"), "'a b'");
        assert_eq!(quote("it's"), r"'it'\''s'");
        assert_eq!(quote("$HOME"), "'$HOME'");
        assert_eq!(quote("héllo"), "'héllo'");
        assert_eq!(quote_bytes(b"a'b"), b"'a'\\''b'".to_vec());
    }
}
