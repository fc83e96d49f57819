// JSON Schema compiled to a GBNF grammar (runtime/grammar.h), so that
// structured output runs on the same machinery as --grammar. The schema is
// a JSON document as the dynamic values of text/jinja_value.h (objects with
// their keys in order).
//
// Honoured: type (one, or a list), properties with required (output in the
// schema's order; an optional property may be left out),
// additionalProperties (false or absent: none; true or a schema: extra keys
// after the named ones), items, prefixItems, minItems / maxItems, enum,
// const, anyOf, allOf of one schema, $ref into #/$defs or #/definitions
// (recursion allowed), minLength / maxLength, format date, time, date-time
// and uuid, and the empty schema (any JSON). Annotations (title,
// description, default, examples, $schema, $id, $comment) change nothing.
// Anything else that constrains a value (pattern, minimum, multipleOf,
// oneOf, not, if, ...) is refused with an error naming it and where it is:
// a schema is never loosened silently.
#pragma once

#include <string>

#include "base/result.h"
#include "text/jinja_value.h"

namespace tern::runtime {

// The grammar of JSON text valid under schema (whitespace between tokens
// allowed, as models write it), or an error naming the first construct it
// cannot honour.
Result<std::string> json_schema_to_gbnf(const text::jinja::Value& schema);

// Any JSON object (response_format {"type": "json_object"}).
std::string json_object_gbnf();

// For grammars that hold several schemas (one per tool): the rule `name`
// for the schema and its helper rules (named name-...), and once per
// grammar the basic rules they all use (value, string, ws, ...).
Result<std::string> json_schema_rules(const text::jinja::Value& schema, const std::string& name);
std::string json_schema_basics();

}  // namespace tern::runtime
