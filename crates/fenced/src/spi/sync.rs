//! Small helpers over std's synchronisation.

/// Locks a std mutex, carrying on past a panic elsewhere (the data it
/// guards stays consistent between statements). Named so that it does not
/// read as the domain's "lock".
pub(crate) fn unpoisoned<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
