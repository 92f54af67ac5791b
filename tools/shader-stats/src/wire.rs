//! What the driver process tells the main process. One record a line, on the same stream as
//! the driver's own messages (RADV writes to stderr), so that whatever the driver prints
//! between a job's `Start` and `Done` is that job's log. A record begins with MARK (ASCII
//! record separator), which no compiler message contains.

pub const MARK: char = '\u{1e}';
const FIELD: char = '\t';
const PART: char = '\u{1f}';

/// One of the driver's statistics (`VK_KHR_pipeline_executable_properties`), as text.
#[derive(Clone, Debug, PartialEq)]
pub struct Statistic {
    pub name: String,
    pub value: String,
    pub description: String,
}

/// A kernel the driver compiled: the entry point it built and the driver's statistics.
#[derive(Clone, Debug, PartialEq)]
pub struct Compiled {
    pub entry: String,
    pub stats: Vec<Statistic>,
}

impl Compiled {
    /// The named statistic as a whole number; `None` when the driver did not report it.
    pub fn figure(&self, name: &str) -> Option<u64> {
        let s = self.stats.iter().find(|s| s.name == name)?;
        s.value.parse().ok()
    }
}

/// Why a kernel has no figures: the step that failed (`read`, `WGSL`, `SPIR-V`, `driver`...)
/// and a one-line message.
#[derive(Clone, Debug, PartialEq)]
pub struct Failure {
    pub stage: String,
    pub message: String,
}

impl Failure {
    pub fn new(stage: &str, message: impl Into<String>) -> Self {
        Failure {
            stage: stage.into(),
            message: message.into(),
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    /// The driver is up: its device's name and driver version.
    Device(String),
    /// Job `i` of the batch begins.
    Start(usize),
    /// Job `i` of the batch is done.
    Done(usize, Result<Compiled, Failure>),
    /// The driver cannot run at all (no Vulkan loader, no RADV device...).
    Fatal(String),
}

/// Keeps a field on its line and inside its field.
fn clean(s: &str) -> String {
    s.trim()
        .chars()
        .map(|c| match c {
            '\n' | '\r' | FIELD | PART | MARK => ' ',
            c => c,
        })
        .collect()
}

impl Record {
    /// The record's line, MARK first, no newline.
    pub fn encode(&self) -> String {
        let fields: Vec<String> = match self {
            Record::Device(name) => vec!["device".into(), clean(name)],
            Record::Start(i) => vec!["start".into(), i.to_string()],
            Record::Done(i, Ok(c)) => {
                let mut f = vec!["ok".into(), i.to_string(), clean(&c.entry)];
                f.extend(c.stats.iter().map(|s| {
                    let parts = [clean(&s.name), clean(&s.value), clean(&s.description)];
                    parts.join(&PART.to_string())
                }));
                f
            }
            Record::Done(i, Err(e)) => {
                vec![
                    "fail".into(),
                    i.to_string(),
                    clean(&e.stage),
                    clean(&e.message),
                ]
            }
            Record::Fatal(message) => vec!["fatal".into(), clean(message)],
        };
        format!("{MARK}{}", fields.join(&FIELD.to_string()))
    }

    /// The record in `text` (what follows MARK), or `None` when it is not one.
    pub fn decode(text: &str) -> Option<Record> {
        let mut fields = text.trim_end_matches(['\n', '\r']).split(FIELD);
        let kind = fields.next()?;
        let mut index = || fields.next()?.parse::<usize>().ok();
        let record = match kind {
            "device" => Record::Device(fields.next()?.into()),
            "start" => Record::Start(index()?),
            "ok" => {
                let i = index()?;
                let entry = fields.next()?.to_string();
                let stats = fields
                    .map(|f| {
                        let mut parts = f.splitn(3, PART);
                        Some(Statistic {
                            name: parts.next()?.into(),
                            value: parts.next()?.into(),
                            description: parts.next().unwrap_or_default().into(),
                        })
                    })
                    .collect::<Option<Vec<_>>>()?;
                Record::Done(i, Ok(Compiled { entry, stats }))
            }
            "fail" => {
                let i = index()?;
                let stage = fields.next()?;
                let message = fields.next().unwrap_or_default();
                Record::Done(i, Err(Failure::new(stage, message)))
            }
            "fatal" => Record::Fatal(fields.next().unwrap_or_default().into()),
            _ => return None,
        };
        Some(record)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_survive_the_line() {
        let stat = |n: &str, v: &str| Statistic {
            name: n.into(),
            value: v.into(),
            description: "per\tlane\n".into(),
        };
        let records = [
            Record::Device("AMD RADV GFX1100 (radv Mesa 22.3.6)".into()),
            Record::Start(3),
            Record::Done(
                3,
                Ok(Compiled {
                    entry: "main".into(),
                    stats: vec![stat("VGPRs", "24"), stat("Spilled SGPRs", "0")],
                }),
            ),
            Record::Done(
                4,
                Ok(Compiled {
                    entry: "main".into(),
                    stats: vec![],
                }),
            ),
            Record::Done(5, Err(Failure::new("WGSL", "expected `;`\nfound `}`"))),
            Record::Fatal("no RADV device".into()),
        ];
        for r in records {
            let line = r.encode();
            assert!(line.starts_with(MARK) && !line.contains('\n'), "{line:?}");
            let back = Record::decode(&line[MARK.len_utf8()..]).unwrap();
            match (&r, &back) {
                (Record::Done(_, Ok(a)), Record::Done(_, Ok(b))) => {
                    assert_eq!(a.entry, b.entry);
                    for (x, y) in a.stats.iter().zip(&b.stats) {
                        assert_eq!((&x.name, &x.value), (&y.name, &y.value));
                        assert_eq!(y.description, "per lane");
                    }
                    assert_eq!(a.stats.len(), b.stats.len());
                }
                (Record::Done(_, Err(_)), Record::Done(_, Err(b))) => {
                    assert_eq!(b.message, "expected `;` found `}`")
                }
                _ => assert_eq!(r, back),
            }
        }
        assert_eq!(Record::decode("nonsense\t1"), None);
        assert_eq!(Record::decode("start\tx"), None);
    }

    #[test]
    fn figures_are_whole_numbers() {
        let c = Compiled {
            entry: "main".into(),
            stats: vec![
                Statistic {
                    name: "VGPRs".into(),
                    value: "24".into(),
                    description: String::new(),
                },
                Statistic {
                    name: "Ratio".into(),
                    value: "0.5".into(),
                    description: String::new(),
                },
            ],
        };
        assert_eq!(c.figure("VGPRs"), Some(24));
        assert_eq!(c.figure("Ratio"), None);
        assert_eq!(c.figure("LDS size"), None);
    }
}
