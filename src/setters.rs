//! `setters!`: the builder methods of a `#[non_exhaustive]` options struct, one per field.
//! Outside the crate such a struct cannot be written as a literal (nor with
//! `..Default::default()`), so that adding a field is not a breaking change; callers start
//! from its `default()` (or its `new`) and set what they need: `Options::default().kernels(k)`.

/// `setters!(Type { field: T, other: Option<U> })` writes, for each field, a method of its
/// name that takes `self` and returns it with that field set. A field of type `Option<U>`
/// is set from a `U` or an `Option<U>` (`None`: back to the default's meaning).
macro_rules! setters {
    ($ty:ty { $($fields:tt)* }) => {
        impl $ty {
            $crate::setters::setters!(@field $($fields)*);
        }
    };
    (@field) => {};
    (@field $field:ident: Option<$t:ty> $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets `", stringify!($field), "` (see the field): a value, or `None`.")]
        pub fn $field(mut self, value: impl Into<Option<$t>>) -> Self {
            self.$field = value.into();
            self
        }
        $crate::setters::setters!(@field $($($rest)*)?);
    };
    (@field $field:ident: $t:ty $(, $($rest:tt)*)?) => {
        #[doc = concat!("Sets `", stringify!($field), "` (see the field).")]
        pub fn $field(mut self, value: $t) -> Self {
            self.$field = value;
            self
        }
        $crate::setters::setters!(@field $($($rest)*)?);
    };
}
pub(crate) use setters;
