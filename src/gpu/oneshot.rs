//! The two things an async core needs and the crate had no dependency for: a one-value
//! channel whose receiving end is a future (what `map_async` and `on_submitted_work_done`
//! callbacks complete), and [`block_on`], the native blocking API's wrapper over the async
//! one.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
}

/// The receiving end: a future of the one value sent.
pub(crate) struct Receiver<T>(Arc<Mutex<Slot<T>>>);

/// A channel for one value: the sender is a callback that stores it and wakes the receiver.
pub(crate) fn channel<T: Send + 'static>() -> (impl FnOnce(T) + Send + 'static, Receiver<T>) {
    let slot = Arc::new(Mutex::new(Slot {
        value: None,
        waker: None,
    }));
    let sender = Arc::clone(&slot);
    let send = move |value: T| {
        let waker = match sender.lock() {
            Ok(mut s) => {
                s.value = Some(value);
                s.waker.take()
            }
            Err(_) => None,
        };
        if let Some(w) = waker {
            w.wake();
        }
    };
    (send, Receiver(slot))
}

impl<T> Receiver<T> {
    /// The value, if it was sent already (without waiting): the native readback's check,
    /// after it polled the device.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    pub(crate) fn try_take(&self) -> Option<T> {
        self.0.lock().ok().and_then(|mut s| s.value.take())
    }
}

impl<T> Future for Receiver<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let Ok(mut slot) = self.0.lock() else {
            return Poll::Pending;
        };
        match slot.value.take() {
            Some(v) => Poll::Ready(v),
            None => {
                slot.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Runs an async core function to its end on this thread: the native blocking API. Every
/// wait inside it polls the device itself, so nothing but this thread has to drive it. Not
/// for the browser, which cannot block: there, await [`crate::Attention::run_async`] (and
/// the crate's other `_async` functions).
pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    pollster::block_on(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_sent_before_or_after_the_first_poll_arrives() {
        let (send, rx) = channel::<u32>();
        send(7);
        assert_eq!(block_on(rx), 7);
        let (send, rx) = channel::<u32>();
        assert!(rx.try_take().is_none());
        let t = std::thread::spawn(move || send(9));
        assert_eq!(block_on(rx), 9);
        t.join().unwrap();
    }
}
