//! A node being converted: its attributes with ONNX's defaults, read with their types checked
//! (an attribute of the wrong type is [`Fail::Invalid`], a valid value Kiln does not implement
//! [`Fail::Unsupported`]).

use crate::Fail;
use crate::proto::{AttributeProto, NodeProto, TensorProto};

/// A node of the graph and the opset version in force for its domain.
pub struct Node<'a> {
    /// The node as stored.
    pub proto: &'a NodeProto,
    /// The opset version of the node's domain.
    pub opset: i64,
}

impl Node<'_> {
    /// The op type (`Conv`, `Relu`, …).
    pub fn op_type(&self) -> &str {
        self.proto.op_type.as_deref().unwrap_or("")
    }

    /// The attribute `name`, if present.
    pub fn attr(&self, name: &str) -> Option<&AttributeProto> {
        (self.proto.attribute.iter()).find(|a| a.name.as_deref() == Some(name))
    }

    /// An integer attribute, or `default`.
    pub fn int(&self, name: &str, default: i64) -> Result<i64, Fail> {
        Ok(self.int_opt(name)?.unwrap_or(default))
    }

    /// An integer attribute, if present.
    pub fn int_opt(&self, name: &str) -> Result<Option<i64>, Fail> {
        self.attr(name)
            .map(|a| a.i.ok_or_else(|| wrong_type(name, "an integer")))
            .transpose()
    }

    /// A positive integer attribute: `default` when absent, required when `default` is `None`.
    pub fn positive(&self, name: &str, default: Option<i64>) -> Result<usize, Fail> {
        let value = (self.int_opt(name)?.or(default))
            .ok_or_else(|| Fail::Invalid(format!("attribute {name} is required")))?;
        (usize::try_from(value).ok().filter(|&v| v > 0))
            .ok_or_else(|| Fail::Invalid(format!("attribute {name}={value} should be positive")))
    }

    /// A float attribute, or `default`.
    pub fn float(&self, name: &str, default: f32) -> Result<f32, Fail> {
        self.attr(name)
            .map(|a| a.f.ok_or_else(|| wrong_type(name, "a float")))
            .transpose()
            .map(|f| f.unwrap_or(default))
    }

    /// A list-of-integers attribute, if present.
    pub fn ints(&self, name: &str) -> Option<&[i64]> {
        self.attr(name).map(|a| a.ints.as_slice())
    }

    /// A list-of-floats attribute, if present.
    pub fn floats(&self, name: &str) -> Option<&[f32]> {
        self.attr(name).map(|a| a.floats.as_slice())
    }

    /// A string attribute, if present.
    pub fn string(&self, name: &str) -> Result<Option<String>, Fail> {
        self.attr(name)
            .map(|a| {
                let bytes = a.s.as_ref().ok_or_else(|| wrong_type(name, "a string"))?;
                String::from_utf8(bytes.clone())
                    .map_err(|_| Fail::Invalid(format!("attribute {name} is not UTF-8")))
            })
            .transpose()
    }

    /// A tensor attribute, if present.
    pub fn tensor(&self, name: &str) -> Result<Option<&TensorProto>, Fail> {
        self.attr(name)
            .map(|a| a.t.as_ref().ok_or_else(|| wrong_type(name, "a tensor")))
            .transpose()
    }

    /// Refuses, as unsupported, an attribute this conversion does not implement, unless it
    /// has its default.
    pub fn refuse_int(&self, name: &str, default: i64) -> Result<(), Fail> {
        match self.int_opt(name)? {
            Some(v) if v != default => Err(Fail::Unsupported(format!(
                "attribute {name}={v} is not supported"
            ))),
            _ => Ok(()),
        }
    }
}

fn wrong_type(name: &str, expected: &str) -> Fail {
    Fail::Invalid(format!("attribute {name} should be {expected}"))
}
