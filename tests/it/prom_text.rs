//! A strict parser of the Prometheus text exposition format (version 0.0.4), for the tests of
//! `GET /metrics`: it refuses what a Prometheus server would refuse (a bad name, label or
//! escape, a sample outside its declared family, a second `# TYPE`, a duplicate series) and
//! what would make the data wrong (a negative counter, a histogram whose buckets are not
//! cumulative or whose `+Inf` bucket is not its count).

use std::collections::BTreeMap;

/// One series' labels, in name order.
pub type Labels = BTreeMap<String, String>;

/// One metric family: its type, help and samples.
#[derive(Debug, Default)]
pub struct Family {
    pub kind: String,
    pub help: Option<String>,
    /// (sample name — the family's, or with `_bucket`/`_sum`/`_count` — labels, value).
    pub samples: Vec<(String, Labels, f64)>,
}

/// Every family of an exposition, by name.
#[derive(Debug, Default)]
pub struct Exposition(pub BTreeMap<String, Family>);

impl Exposition {
    /// The value of the sample `name` with exactly `labels`; panics (naming what is there)
    /// when there is none.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let want: Labels = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        self.0
            .values()
            .flat_map(|f| f.samples.iter())
            .find(|(n, l, _)| n == name && *l == want)
            .map(|s| s.2)
            .unwrap_or_else(|| panic!("no sample {name}{want:?} in {:#?}", self.0.keys()))
    }

    /// The family `name`; panics when there is none.
    pub fn family(&self, name: &str) -> &Family {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no family {name} in {:?}", self.0.keys()))
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_' || f == ':')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_' || x == ':')
}

fn is_label_name(s: &str) -> bool {
    let mut c = s.chars();
    c.next()
        .is_some_and(|f| f.is_ascii_alphabetic() || f == '_')
        && c.all(|x| x.is_ascii_alphanumeric() || x == '_')
        && !s.starts_with("__")
}

fn parse_value(s: &str) -> Result<f64, String> {
    match s {
        "+Inf" => Ok(f64::INFINITY),
        "-Inf" => Ok(f64::NEG_INFINITY),
        "NaN" => Ok(f64::NAN),
        _ => s
            .parse::<f64>()
            .ok()
            .filter(|_| !s.eq_ignore_ascii_case("inf") && !s.eq_ignore_ascii_case("nan"))
            .ok_or_else(|| format!("`{s}` is not a sample value")),
    }
}

/// `{a="x",b="y"}` at the start of `s`: the labels and the rest of `s`.
fn parse_labels(s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Labels::new();
    let mut rest = s.strip_prefix('{').expect("called on a `{`");
    loop {
        if let Some(r) = rest.strip_prefix('}') {
            return Ok((labels, r));
        }
        let eq = rest.find('=').ok_or("a label without `=`")?;
        let name = &rest[..eq];
        if !is_label_name(name) {
            return Err(format!("`{name}` is not a label name"));
        }
        rest = rest[eq + 1..]
            .strip_prefix('"')
            .ok_or_else(|| format!("label {name}'s value is not quoted"))?;
        let mut value = String::new();
        let mut chars = rest.char_indices();
        let end = loop {
            match chars.next() {
                None => return Err(format!("label {name}'s value is not closed")),
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, '\\')) => value.push('\\'),
                    Some((_, '"')) => value.push('"'),
                    Some((_, 'n')) => value.push('\n'),
                    other => return Err(format!("bad escape in label {name}: {other:?}")),
                },
                Some((_, '\n')) => return Err(format!("a raw newline in label {name}")),
                Some((_, c)) => value.push(c),
            }
        };
        if labels.insert(name.to_string(), value).is_some() {
            return Err(format!("label {name} twice"));
        }
        rest = &rest[end + 1..];
        if let Some(r) = rest.strip_prefix(',') {
            rest = r;
        } else if !rest.starts_with('}') {
            return Err(format!("`{rest}` after label {name}"));
        }
    }
}

/// The family a sample named `name` belongs to, given the declared families.
fn family_of<'a>(name: &'a str, families: &BTreeMap<String, Family>) -> Option<&'a str> {
    if families.contains_key(name) {
        return Some(name);
    }
    for suffix in ["_bucket", "_sum", "_count"] {
        if let Some(base) = name.strip_suffix(suffix) {
            if families.get(base).is_some_and(|f| {
                f.kind == "histogram" || (f.kind == "summary" && suffix != "_bucket")
            }) {
                return Some(base);
            }
        }
    }
    None
}

/// Parses `text` strictly; the first thing wrong, with its line number.
pub fn parse(text: &str) -> Result<Exposition, String> {
    if !text.is_empty() && !text.ends_with('\n') {
        return Err("the text does not end with a newline".into());
    }
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    // The family whose samples are being read: a family's lines are contiguous.
    let mut current: Option<String> = None;
    let mut seen = std::collections::BTreeSet::new();
    for (i, line) in text.lines().enumerate() {
        let at = |e: String| format!("line {}: {e}: {line:?}", i + 1);
        if line.is_empty() {
            continue;
        }
        if let Some(comment) = line.strip_prefix('#') {
            let words: Vec<&str> = comment.trim_start().splitn(3, ' ').collect();
            match words.as_slice() {
                ["HELP", name, help] | ["TYPE", name, help] if !is_metric_name(name) => {
                    let _ = help;
                    return Err(at(format!("`{name}` is not a metric name")));
                }
                ["HELP", name, help] => {
                    let f = families.entry(name.to_string()).or_default();
                    if f.help.replace(help.to_string()).is_some() {
                        return Err(at(format!("a second HELP for {name}")));
                    }
                }
                ["TYPE", name, kind] => {
                    if !["counter", "gauge", "histogram", "summary", "untyped"].contains(kind) {
                        return Err(at(format!("unknown type `{kind}`")));
                    }
                    let f = families.entry(name.to_string()).or_default();
                    if !f.kind.is_empty() {
                        return Err(at(format!("a second TYPE for {name}")));
                    }
                    if !f.samples.is_empty() {
                        return Err(at(format!("the TYPE of {name} after its samples")));
                    }
                    f.kind = kind.to_string();
                    current = Some(name.to_string());
                }
                _ => {} // a plain comment
            }
            continue;
        }
        let name_end = line.find(['{', ' ']).ok_or_else(|| at("no value".into()))?;
        let name = &line[..name_end];
        if !is_metric_name(name) {
            return Err(at(format!("`{name}` is not a metric name")));
        }
        let (labels, rest) = if line[name_end..].starts_with('{') {
            parse_labels(&line[name_end..]).map_err(at)?
        } else {
            (Labels::new(), &line[name_end..])
        };
        let fields: Vec<&str> = rest.split(' ').filter(|s| !s.is_empty()).collect();
        let value = match fields.as_slice() {
            [v] | [v, _] => parse_value(v).map_err(at)?,
            _ => return Err(at("expected a value and an optional timestamp".into())),
        };
        if let [_, ts] = fields.as_slice() {
            ts.parse::<i64>()
                .map_err(|_| at(format!("`{ts}` is not a timestamp")))?;
        }
        let family = family_of(name, &families)
            .ok_or_else(|| at(format!("{name} has no TYPE before it")))?
            .to_string();
        if current.as_deref() != Some(family.as_str()) {
            return Err(at(format!("{name} is not next to the rest of {family}")));
        }
        if !seen.insert((name.to_string(), labels.clone())) {
            return Err(at(format!("{name}{labels:?} twice")));
        }
        let f = families.get_mut(&family).expect("found above");
        if f.kind == "counter" && (value.is_nan() || value < 0.0) {
            return Err(at(format!("counter {name} is {value}")));
        }
        if name.ends_with("_bucket") && !labels.contains_key("le") {
            return Err(at(format!("bucket {name} without `le`")));
        }
        f.samples.push((name.to_string(), labels, value));
    }
    for (name, f) in &families {
        if f.kind.is_empty() {
            return Err(format!("{name} has a HELP but no TYPE"));
        }
        if f.kind == "histogram" {
            check_histogram(name, f)?;
        }
    }
    Ok(Exposition(families))
}

/// Each series of histogram `name`: buckets cumulative in `le` order, ending at `+Inf` equal
/// to its `_count`, and a `_sum`.
fn check_histogram(name: &str, f: &Family) -> Result<(), String> {
    let mut series: BTreeMap<Labels, Vec<(f64, f64)>> = BTreeMap::new();
    for (n, labels, v) in &f.samples {
        if n.ends_with("_bucket") {
            let mut rest = labels.clone();
            let le = parse_value(&rest.remove("le").expect("checked"))?;
            series.entry(rest).or_default().push((le, *v));
        }
    }
    for (labels, mut buckets) in series {
        buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
        if buckets.windows(2).any(|w| w[1].1 < w[0].1) {
            return Err(format!(
                "{name}{labels:?}: buckets are not cumulative: {buckets:?}"
            ));
        }
        let last = buckets.last().expect("one bucket at least");
        if last.0 != f64::INFINITY {
            return Err(format!("{name}{labels:?} has no +Inf bucket"));
        }
        let find = |suffix: &str| {
            f.samples
                .iter()
                .find(|(n, l, _)| *n == format!("{name}{suffix}") && *l == labels)
                .map(|s| s.2)
        };
        let count = find("_count").ok_or_else(|| format!("{name}{labels:?} has no _count"))?;
        find("_sum").ok_or_else(|| format!("{name}{labels:?} has no _sum"))?;
        if count != last.1 {
            return Err(format!(
                "{name}{labels:?}: +Inf bucket {} but count {count}",
                last.1
            ));
        }
    }
    Ok(())
}

#[test]
fn the_parser_takes_a_good_exposition() {
    let text = "# HELP a_total Things.\n# TYPE a_total counter\na_total{k=\"v \\\"q\\\" \\\\ \\n\"} 3\n\
                # TYPE h histogram\nh_bucket{le=\"0.5\"} 1\nh_bucket{le=\"+Inf\"} 2\nh_sum 1.5\nh_count 2\n\
                # TYPE g gauge\ng -1 1700000000000\n";
    let e = parse(text).expect("valid");
    assert_eq!(e.value("a_total", &[("k", "v \"q\" \\ \n")]), 3.0);
    assert_eq!(e.value("h_count", &[]), 2.0);
    assert_eq!(e.value("g", &[]), -1.0);
}

#[test]
fn the_parser_refuses_what_prometheus_would() {
    for bad in [
        "x 1\n",                                          // no TYPE
        "# TYPE x counter\nx 1",                          // no final newline
        "# TYPE x counter\n# TYPE x counter\nx 1\n",      // TYPE twice
        "# TYPE x counter\nx -1\n",                       // negative counter
        "# TYPE x counter\nx{a=\"1\"} 1\nx{a=\"1\"} 2\n", // a series twice
        "# TYPE x counter\nx{a=1} 1\n",                   // unquoted label
        "# TYPE x counter\nx{a=\"\\t\"} 1\n",             // bad escape
        "# TYPE x counter\nx{0a=\"1\"} 1\n",              // bad label name
        "# TYPE x counter\nx one\n",                      // bad value
        "# TYPE x counter\n# TYPE y gauge\ny 1\nx 2\n",   // family not contiguous
        "# TYPE x wat\nx 1\n",                            // unknown type
        "# TYPE h histogram\nh_bucket{le=\"1\"} 2\nh_bucket{le=\"+Inf\"} 1\nh_sum 1\nh_count 1\n",
        "# TYPE h histogram\nh_bucket{le=\"1\"} 1\nh_sum 1\nh_count 1\n", // no +Inf
        "# TYPE h histogram\nh_bucket{le=\"+Inf\"} 2\nh_sum 1\nh_count 1\n", // count differs
        "# TYPE h histogram\nh_bucket 1\nh_sum 1\nh_count 1\n",           // bucket without le
        "# HELP x Things.\n",                                             // HELP without TYPE
    ] {
        assert!(parse(bad).is_err(), "accepted: {bad:?}");
    }
}
