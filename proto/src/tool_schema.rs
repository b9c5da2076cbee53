//! JSON Schemas (2020-12) of the fields that hold a JSON Schema themselves
//! (a tool's `input_schema`, a run's `output_schema`), for the `schemars`
//! derives of the config types (`#[schemars(with = …)]` on those
//! `serde_json::Value` fields). Only with the feature `schemars`.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};

/// A tool's input schema (or a run's output schema): a JSON Schema
/// (2020-12 unless `$schema` names another draft) of a JSON object. It
/// must compile, with references inside the schema only; a reference to
/// another document is refused, never fetched ([`crate::limits::check_schema`]).
pub struct ToolInputSchema;

impl JsonSchema for ToolInputSchema {
    fn schema_name() -> Cow<'static, str> {
        "ToolInputSchema".into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let node = generator.subschema_for::<JsonSchemaNode>();
        json_schema!({
            "description": "A JSON Schema (2020-12 unless `$schema` names another draft) of the tool's arguments, which are a JSON object: `type` must be `object`. It must compile; references to other documents are refused (422 naming the field).",
            "type": "object",
            "required": ["type"],
            "properties": {
                "type": {"const": "object"},
                "description": {"type": "string"},
                "properties": {"type": "object", "additionalProperties": node},
                "required": {"type": "array", "items": {"type": "string"}, "uniqueItems": true},
                "additionalProperties": node
            }
        })
    }
}

/// One property's schema inside a [`ToolInputSchema`]: the common keywords
/// with the types their meta-schema (2020-12) gives them, one level deep
/// (an array's `items` is described by type and description only). Other
/// keywords and deeper nesting are accepted too: the schema as a whole
/// must compile.
pub struct JsonSchemaNode;

impl JsonSchema for JsonSchemaNode {
    fn schema_name() -> Cow<'static, str> {
        "JsonSchemaNode".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        let simple = serde_json::json!({"enum": ["array", "boolean", "integer", "null", "number", "object", "string"]});
        let types = serde_json::json!({"anyOf": [simple, {"type": "array", "items": simple, "minItems": 1, "uniqueItems": true}]});
        // The meta-schema's nonNegativeInteger: no maximum.
        let n = serde_json::json!({"type": "integer", "minimum": 0});
        json_schema!({
            "type": ["object", "boolean"],
            "properties": {
                "type": types,
                "description": {"type": "string"},
                "items": {"type": ["object", "boolean"], "properties": {"type": types, "description": {"type": "string"}}},
                "enum": {"type": "array"},
                "minimum": {"type": "number"},
                "maximum": {"type": "number"},
                "minLength": n, "maxLength": n, "minItems": n, "maxItems": n
            }
        })
    }
}
