"""The building blocks of request bodies: a strict base model, valid Unicode text, and the mark of a refused field.

Bodies accept unknown fields (OpenAI's and vLLM's servers ignore them) and are strict about types (JSON Schema's:
no "3" for an integer). A field the server cannot honour is declared with `refused(no-op values)`: its JSON Schema
says it takes only those values (and null), and `refused_fields` reads them back for the check that names it.
"""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

REFUSED = "x-refused"  # the JSON Schema keyword that marks a refused field (its `enum`: the values that pass)


def unicode_text(text: str) -> str:
    """JSON may escape a lone surrogate ("\\ud800"): not text a tokenizer can encode or a reply can hold."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"holds a lone surrogate at character {exc.start}: not valid Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(unicode_text)]


class Body(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False, strict=True)


def refused(*no_ops: Any) -> Any:
    """A field this server cannot honour: documented as taking only the values that ask for nothing (and null)."""
    unless = f" unless {' or '.join(json.dumps(v) for v in no_ops)}" if no_ops else ""
    return Field(
        None, description=f"not supported: refused{unless}", json_schema_extra={"enum": [None, *no_ops], REFUSED: True}
    )


def refused_fields(model: type[BaseModel]) -> dict[str, list[Any]]:
    """The model's refused fields -> the values that pass."""
    return {
        name: list(info.json_schema_extra["enum"])  # type: ignore[arg-type]  # refused wrote a list there
        for name, info in model.model_fields.items()
        if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get(REFUSED)
    }
