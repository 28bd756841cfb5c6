//! List queries: `limit`, `cursor`, `sortOrder` and the filters parsed with the service's
//! wording, and pages cut in sequence order behind opaque cursors.

use base64::Engine as _;

use crate::fake::wire::{ApiError, Pagination};

/// A parsed list query (`limit`, `cursor`, `sortOrder` and the filters).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ListQuery {
    pub project: Option<String>,
    pub name: Option<String>,
    pub name_prefix: Option<String>,
    pub tags: Vec<(String, String)>,
    pub limit: usize,
    pub cursor: Option<u64>,
    pub ascending: bool,
}

const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 50;

impl ListQuery {
    /// Parses the query pairs of a list call (repeated `tags=k:v` allowed).
    pub(crate) fn parse(pairs: &[(String, String)]) -> Result<ListQuery, ApiError> {
        let mut q = ListQuery {
            limit: DEFAULT_LIMIT,
            ..ListQuery::default()
        };
        for (k, v) in pairs {
            match k.as_str() {
                "project" | "projectId" => q.project = Some(v.clone()),
                "name" => q.name = Some(v.clone()),
                "namePrefix" => q.name_prefix = Some(v.clone()),
                "tags" => {
                    let (tk, tv) = v.split_once(':').ok_or_else(|| {
                        ApiError::invalid(format!("`tags` should look like key:value (got {v:?})."))
                    })?;
                    q.tags.push((tk.to_string(), tv.to_string()));
                }
                "limit" => {
                    let n: usize = v
                        .parse()
                        .map_err(|_| ApiError::invalid("`limit` should be integer."))?;
                    if n == 0 {
                        return Err(ApiError::invalid("`limit` should be >= 1."));
                    }
                    if n > MAX_LIMIT {
                        return Err(ApiError::invalid(format!(
                            "`limit` should be <= {MAX_LIMIT}."
                        )));
                    }
                    q.limit = n;
                }
                "cursor" => q.cursor = Some(decode_cursor(v)?),
                "sortOrder" => {
                    match v.as_str() {
                        "asc" => q.ascending = true,
                        "desc" => q.ascending = false,
                        _ => return Err(ApiError::invalid(
                            "`sortOrder` should be equal to one of the allowed values: asc, desc.",
                        )),
                    }
                }
                // teamId, sortBy and anything else the SDK adds are accepted and ignored.
                _ => {}
            }
        }
        Ok(q)
    }

    /// Orders `items` by sequence, skips to the cursor and cuts a page.
    pub(super) fn page<T>(&self, mut items: Vec<(u64, T)>) -> (Vec<T>, Pagination) {
        items.sort_by_key(|(seq, _)| *seq);
        if !self.ascending {
            items.reverse();
        }
        if let Some(c) = self.cursor {
            items.retain(|(seq, _)| if self.ascending { *seq > c } else { *seq < c });
        }
        let more = items.len() > self.limit;
        items.truncate(self.limit);
        let next = if more {
            items.last().map(|(seq, _)| encode_cursor(*seq))
        } else {
            None
        };
        let page: Vec<T> = items.into_iter().map(|(_, t)| t).collect();
        let count = page.len();
        (page, Pagination { count, next })
    }
}

fn encode_cursor(seq: u64) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("seq:{seq}"))
}

fn decode_cursor(s: &str) -> Result<u64, ApiError> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(s)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|t| t.strip_prefix("seq:").and_then(|n| n.parse().ok()))
        .ok_or_else(|| ApiError::invalid("`cursor` is not a cursor this server issued."))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fake::model::fixtures::{booted, settings};
    use crate::fake::model::World;

    #[test]
    fn lists_filter_and_paginate() {
        let mut w = World::new(settings(), "t".into());
        for i in 0..5 {
            let tag = if i % 2 == 0 { "even" } else { "odd" };
            booted(
                &mut w,
                &format!(r#"{{"projectId":"p","name":"s{i}","tags":{{"kind":"{tag}"}}}}"#),
                i,
            );
        }
        let pairs = |s: &[(&str, &str)]| -> Vec<(String, String)> {
            s.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect()
        };
        let q = ListQuery::parse(&pairs(&[("tags", "kind:even"), ("limit", "2")])).unwrap();
        let page = w.list_sandboxes(&q, 10);
        let names: Vec<&str> = page["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["name"].as_str().unwrap())
            .collect();
        assert_eq!(names, ["s4", "s2"]);
        assert_eq!(page["pagination"]["count"], 2);
        let next = page["pagination"]["next"].as_str().unwrap().to_string();
        let q2 = ListQuery::parse(&pairs(&[
            ("tags", "kind:even"),
            ("limit", "2"),
            ("cursor", &next),
        ]))
        .unwrap();
        let page2 = w.list_sandboxes(&q2, 10);
        assert_eq!(page2["sandboxes"][0]["name"], "s0");
        assert!(page2["pagination"]["next"].is_null());
        assert!(ListQuery::parse(&pairs(&[("limit", "51")])).is_err());
        assert!(ListQuery::parse(&pairs(&[("cursor", "garbage!")])).is_err());
        assert!(ListQuery::parse(&pairs(&[("tags", "nocolon")])).is_err());
    }
}
