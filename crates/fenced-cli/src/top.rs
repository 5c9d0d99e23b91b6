//! `fenced top [PREFIX]`: the held and waited-for locks, live, in the
//! terminal (ratatui); `q`, Esc or Ctrl-C quits.

use crate::connect;
use clap::Args;
use ratatui::crossterm::event::{self, Event, KeyCode, KeyEventKind, KeyModifiers};
use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Modifier, Style};
use ratatui::text::Line;
use ratatui::widgets::{Paragraph, Row, Table};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args, Debug)]
pub(crate) struct TopArgs {
    /// Only the locks whose names start with this.
    #[arg(default_value = "")]
    prefix: String,
    /// How often to look again.
    #[arg(long, default_value = "1s", value_parser = crate::parse_positive_duration)]
    interval: Duration,
}

/// What a keypress asks.
enum Key {
    Quit,
    Refresh,
}

pub(crate) async fn top(backend: Option<String>, args: TopArgs) -> anyhow::Result<ExitCode> {
    if !std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        eprintln!("fenced: top draws on a terminal; in a script, use `fenced list` (--json)");
        return Ok(ExitCode::from(2));
    }
    let client = connect(backend.as_deref()).await?;
    let keys = keys();
    let mut terminal = ratatui::init();
    let shown = show(&client, &args, keys, &mut terminal).await;
    ratatui::restore();
    client.close().await;
    shown?;
    Ok(ExitCode::SUCCESS)
}

/// Keypresses, read on a thread of their own: the runtime is a single
/// thread, and the client's sessions must keep running while it waits.
fn keys() -> tokio::sync::mpsc::UnboundedReceiver<Key> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    std::thread::spawn(move || {
        while !tx.is_closed() {
            // A tenth of a second at a time, to notice the view has gone.
            // A terminal that cannot be read ends the view.
            match event::poll(Duration::from_millis(100)) {
                Ok(true) => {}
                Ok(false) => continue,
                Err(_) => {
                    let _ = tx.send(Key::Quit);
                    break;
                }
            }
            let Ok(Event::Key(k)) = event::read() else {
                continue;
            };
            if k.kind != KeyEventKind::Press {
                continue;
            }
            let key = match k.code {
                KeyCode::Char('q') | KeyCode::Esc => Key::Quit,
                KeyCode::Char('c') if k.modifiers.contains(KeyModifiers::CONTROL) => Key::Quit,
                KeyCode::Char('r') => Key::Refresh,
                _ => continue,
            };
            if tx.send(key).is_err() {
                break;
            }
        }
    });
    rx
}

async fn show(
    client: &fenced::Client,
    args: &TopArgs,
    mut keys: tokio::sync::mpsc::UnboundedReceiver<Key>,
    terminal: &mut ratatui::DefaultTerminal,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    // SIGTERM and SIGHUP end the view as q does, so the terminal is put
    // back (raw mode has turned Ctrl-C into a key).
    let mut term = signal(SignalKind::terminate())?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut locks = Vec::new();
    loop {
        // Keys and signals are heard while it looks, too: a slow server
        // or a long list must not keep q from quitting.
        let looked = tokio::select! {
            looked = client.list(&args.prefix) => looked,
            key = keys.recv() => match key {
                Some(Key::Refresh) => continue,
                Some(Key::Quit) | None => return Ok(()),
            },
            _ = term.recv() => return Ok(()),
            _ = hup.recv() => return Ok(()),
        };
        // A failed look keeps the last view and says why.
        let said = match looked {
            Ok(l) => {
                locks = l;
                format!(
                    "as of {}",
                    humantime::format_rfc3339_seconds(std::time::SystemTime::now())
                )
            }
            Err(e) => format!("could not look: {e}"),
        };
        terminal.draw(|f| draw(f, client.url(), &args.prefix, &locks, &said))?;
        tokio::select! {
            key = keys.recv() => match key {
                Some(Key::Refresh) => {}
                Some(Key::Quit) | None => return Ok(()),
            },
            _ = term.recv() => return Ok(()),
            _ = hup.recv() => return Ok(()),
            _ = tokio::time::sleep(args.interval) => {}
        }
    }
}

fn draw(f: &mut ratatui::Frame, url: &str, prefix: &str, locks: &[fenced::LockEntry], said: &str) {
    let [head, body, foot] = Layout::vertical([
        Constraint::Length(2),
        Constraint::Min(1),
        Constraint::Length(1),
    ])
    .areas(f.area());
    let held = locks.iter().filter(|l| !l.status.is_free()).count();
    let waiting: usize = locks.iter().map(|l| l.status.waiters).sum();
    let under = if prefix.is_empty() {
        String::new()
    } else {
        format!(" under {prefix:?}")
    };
    f.render_widget(
        Paragraph::new(vec![
            Line::from(format!("fenced top: {url}{under}")),
            Line::from(format!(
                "{held} held, {} with waiters only, {waiting} waiting; {said}",
                locks.len() - held
            )),
        ]),
        head,
    );
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let header = Row::new(crate::status::HEADER).style(bold);
    let rows = crate::status::table_rows(locks).into_iter().map(Row::new);
    let widths = [
        Constraint::Fill(2),
        Constraint::Length(18),
        Constraint::Length(20),
        Constraint::Length(11),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Fill(3),
    ];
    f.render_widget(Table::new(rows, widths).header(header), body);
    f.render_widget(Paragraph::new("q quits, r looks again"), foot);
}
