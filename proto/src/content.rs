//! Content blocks, messages and token usage: the conversation's vocabulary.
//!
//! The shapes follow the Anthropic Messages API (tool results travel in a user
//! turn), so the wire format and the stored format need no translation. Every
//! type here is a plain value: cloning is the only way to "change" one, and a
//! JSON round trip is exact (property-tested in `tests/roundtrip.rs`).

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Who said a message. Tool results are sent as a `user` turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// The person (or the harness speaking for them: goals, tool results, notices).
    User,
    /// The model.
    Assistant,
}

/// One block of a message. A closed set: match on it, there are no others.
///
/// JSON: `{"type": "text", "text": "…"}`, `{"type": "tool_use", "id": "…",
/// "name": "…", "input": {…}}`, `{"type": "tool_result", "tool_use_id": "…",
/// "content": "…", "is_error": false}` (or `"content": [blocks]`, see
/// [`ToolContent`]), `{"type": "thinking", "thinking": "…", "signature":
/// "…"}`, `{"type": "redacted_thinking", "data": "…"}`.
///
/// Images exist only inside a tool result's [`ToolContent::Blocks`], so a
/// tool result (in a user turn) is the one place a request can carry one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    /// Plain text.
    Text {
        /// The text; providers reject empty text blocks.
        text: String,
    },
    /// The model asks for a tool call.
    ToolUse {
        /// Call id, unique within the run (the provider's `toolu_…` / `call_…`).
        id: String,
        /// Tool name as listed in the request.
        name: String,
        /// Arguments, a JSON object.
        input: Value,
    },
    /// The answer to a [`ContentBlock::ToolUse`], in the next user turn.
    ToolResult {
        /// The `id` of the tool use it answers.
        tool_use_id: String,
        /// What the tool said: text (JSON results are serialised), or text
        /// and image blocks.
        content: ToolContent,
        /// True when the call failed; the model sees the text as an error.
        #[serde(default)]
        is_error: bool,
    },
    /// Model reasoning with the provider's signature. Kept in the log, never
    /// sent back for earlier turns (see [`crate::repair`]).
    Thinking {
        /// The reasoning text.
        thinking: String,
        /// Opaque provider signature; empty when the provider gives none.
        #[serde(default)]
        signature: String,
    },
    /// Model reasoning the provider encrypted (Anthropic's
    /// `redacted_thinking`): opaque, never shown, but sent back unchanged
    /// with the last assistant turn like [`ContentBlock::Thinking`].
    RedactedThinking {
        /// The provider's encrypted payload.
        data: String,
    },
}

impl ContentBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ContentBlock::Text { text: text.into() }
    }
}

/// The content of a tool result: plain text, or a list of text and image
/// blocks.
///
/// JSON: a string for [`ToolContent::Text`] (every log written before images
/// existed, and every text-only result), an array for
/// [`ToolContent::Blocks`] — the two forms Anthropic's Messages API accepts
/// for `tool_result.content` ("Tool use": "content: string or a list of
/// nested content blocks such as text or image"). A string never reads back
/// as blocks nor the reverse, so a JSON round trip is exact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ToolContent {
    /// Text only.
    Text(String),
    /// Blocks in order; used when the result has an image.
    Blocks(Vec<ResultBlock>),
}

impl ToolContent {
    /// `Text` of the text blocks joined by `\n` when `blocks` has no image,
    /// else `Blocks(blocks)`.
    ///
    /// ```
    /// use glia_proto::{ImageSource, ResultBlock, ToolContent};
    /// let text = ToolContent::from_blocks(vec![ResultBlock::text("a"), ResultBlock::text("b")]);
    /// assert_eq!(text, ToolContent::Text("a\nb".into()));
    /// let png = ResultBlock::Image { source: ImageSource::base64("image/png", "iVBORw0KGgo=") };
    /// assert!(matches!(ToolContent::from_blocks(vec![png]), ToolContent::Blocks(_)));
    /// ```
    pub fn from_blocks(blocks: Vec<ResultBlock>) -> Self {
        if blocks.iter().all(|b| matches!(b, ResultBlock::Text { .. })) {
            let texts: Vec<&str> = blocks.iter().filter_map(ResultBlock::as_text).collect();
            ToolContent::Text(texts.join("\n"))
        } else {
            ToolContent::Blocks(blocks)
        }
    }

    /// The content as text, for places that show or count text (summaries,
    /// the inbox, token estimates): text blocks joined by `\n`, each image
    /// as `[image: image/png, 1234 bytes]` (bytes decoded).
    pub fn to_text(&self) -> std::borrow::Cow<'_, str> {
        match self {
            ToolContent::Text(text) => text.as_str().into(),
            ToolContent::Blocks(blocks) => blocks
                .iter()
                .map(|b| match b {
                    ResultBlock::Text { text } => text.clone(),
                    ResultBlock::Image { source } => format!("[image: {}]", source.describe()),
                })
                .collect::<Vec<_>>()
                .join("\n")
                .into(),
        }
    }

    /// The images, in order.
    pub fn images(&self) -> impl Iterator<Item = &ImageSource> {
        let blocks = match self {
            ToolContent::Text(_) => &[][..],
            ToolContent::Blocks(blocks) => blocks.as_slice(),
        };
        blocks.iter().filter_map(|b| match b {
            ResultBlock::Image { source } => Some(source),
            ResultBlock::Text { .. } => None,
        })
    }

    /// Bytes of text in this content: the text, or every text block's
    /// summed (the `\n` joins and images not counted; images have their own
    /// limit, [`MAX_IMAGE_BASE64_LEN`]).
    pub fn text_len(&self) -> usize {
        match self {
            ToolContent::Text(text) => text.len(),
            ToolContent::Blocks(blocks) => blocks
                .iter()
                .filter_map(ResultBlock::as_text)
                .map(str::len)
                .sum(),
        }
    }

    /// This content with at most `max_bytes` bytes of text ([`Self::text_len`]),
    /// the result budget's one cut: unchanged (borrowed) when it fits; else the head
    /// of its text, cut on a UTF-8 character boundary (so up to 3 bytes
    /// under `max_bytes`), then a blank line and a marked notice
    /// ([`Insert::Cut`](crate::marker::Insert::Cut), [`cut_notice`]) giving
    /// the original and the shown sizes in bytes. Text blocks past the
    /// budget are left out; images are kept, in order (they count
    /// separately). Deterministic: the same content and budget give the
    /// same bytes.
    ///
    /// ```
    /// use glia_proto::ToolContent;
    /// let whole = ToolContent::from("ééé"); // 6 bytes; 'é' is 2
    /// assert!(whole.cut(3).to_text().starts_with("é\n\n⟦glia:cut⟧ "));
    /// assert_eq!(*ToolContent::from("short").cut(5), "short");
    /// ```
    pub fn cut(&self, max_bytes: usize) -> std::borrow::Cow<'_, Self> {
        let total = self.text_len();
        if total <= max_bytes {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(match self {
            ToolContent::Text(text) => {
                let head = &text[..text.floor_char_boundary(max_bytes)];
                ToolContent::Text(format!("{head}\n\n{}", cut_notice(total, head.len())))
            }
            ToolContent::Blocks(blocks) => {
                let mut left = max_bytes;
                let mut kept = Vec::with_capacity(blocks.len() + 1);
                for block in blocks {
                    match block {
                        ResultBlock::Text { text } => {
                            let head = &text[..text.floor_char_boundary(left)];
                            left -= head.len();
                            if !head.is_empty() {
                                kept.push(ResultBlock::text(head));
                            }
                        }
                        image => kept.push(image.clone()),
                    }
                }
                kept.push(ResultBlock::text(cut_notice(total, max_bytes - left)));
                ToolContent::Blocks(kept)
            }
        })
    }

    /// This content for a model that takes no images: each image becomes a
    /// marked text block ([`Insert::ImageOmitted`](crate::marker::Insert::ImageOmitted))
    /// naming its media type and decoded size in bytes, and a result left
    /// with text only is one string ([`Self::from_blocks`]).
    ///
    /// ```
    /// use glia_proto::{ImageSource, ResultBlock, ToolContent};
    /// let png = ResultBlock::Image { source: ImageSource::base64("image/png", "iVBORw0KGgo=") };
    /// let seen = ToolContent::Blocks(vec![ResultBlock::text("chart:"), png]).without_images();
    /// assert_eq!(seen, "chart:\n⟦glia:image-omitted⟧ [image not shown: image/png, 8 bytes; this model does not take images]");
    /// ```
    pub fn without_images(self) -> Self {
        match self {
            ToolContent::Text(_) => self,
            ToolContent::Blocks(blocks) => ToolContent::from_blocks(
                blocks
                    .into_iter()
                    .map(|b| match b {
                        ResultBlock::Image { source } => {
                            ResultBlock::text(crate::marker::Insert::ImageOmitted.wrap(&format!(
                                "[image not shown: {}; this model does not take images]",
                                source.describe()
                            )))
                        }
                        text => text,
                    })
                    .collect(),
            ),
        }
    }

    /// `text`, a blank line, then this content: a reminder shown before a
    /// result (a text result stays one string; blocks get a leading text
    /// block).
    pub fn prefixed(self, text: &str) -> Self {
        match self {
            ToolContent::Text(content) => ToolContent::Text(format!("{text}\n\n{content}")),
            ToolContent::Blocks(mut blocks) => {
                blocks.insert(0, ResultBlock::text(text));
                ToolContent::Blocks(blocks)
            }
        }
    }
}

/// The notice after a cut result ([`ToolContent::cut`]): marked
/// [`Insert::Cut`](crate::marker::Insert::Cut), byte-stable for the same
/// sizes (`total` and `shown` in bytes of text).
///
/// ```
/// assert_eq!(
///     glia_proto::content::cut_notice(5_242_880, 65_536),
///     "⟦glia:cut⟧ [result cut: 5242880 bytes of text, the first 65536 shown. The run's log keeps the whole result; to see more, call the tool again for a narrower result (a filter, a range or a page).]"
/// );
/// ```
pub fn cut_notice(total: usize, shown: usize) -> String {
    crate::marker::Insert::Cut.wrap(&format!(
        "[result cut: {total} bytes of text, the first {shown} shown. The run's log keeps the whole result; to see more, call the tool again for a narrower result (a filter, a range or a page).]"
    ))
}

impl From<String> for ToolContent {
    fn from(text: String) -> Self {
        ToolContent::Text(text)
    }
}

/// Shown as [`ToolContent::to_text`].
impl std::fmt::Display for ToolContent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.to_text())
    }
}

/// Equal when the content is [`ToolContent::Text`] of that string (blocks
/// never equal a string, even text-only ones).
impl PartialEq<str> for ToolContent {
    fn eq(&self, other: &str) -> bool {
        matches!(self, ToolContent::Text(text) if text == other)
    }
}

impl PartialEq<&str> for ToolContent {
    fn eq(&self, other: &&str) -> bool {
        self == *other
    }
}

impl PartialEq<String> for ToolContent {
    fn eq(&self, other: &String) -> bool {
        self == other.as_str()
    }
}

impl From<&str> for ToolContent {
    fn from(text: &str) -> Self {
        ToolContent::Text(text.to_owned())
    }
}

/// One block of [`ToolContent::Blocks`]: `{"type": "text", "text": "…"}` or
/// `{"type": "image", "source": {…}}` (Anthropic's text and image content
/// blocks).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResultBlock {
    /// Text; providers reject empty text blocks.
    Text {
        /// The text.
        text: String,
    },
    /// An image.
    Image {
        /// The image's bytes and media type.
        source: ImageSource,
    },
}

impl ResultBlock {
    /// A text block.
    pub fn text(text: impl Into<String>) -> Self {
        ResultBlock::Text { text: text.into() }
    }

    fn as_text(&self) -> Option<&str> {
        match self {
            ResultBlock::Text { text } => Some(text),
            ResultBlock::Image { .. } => None,
        }
    }
}

/// The media types an image may have in a request: the ones both
/// Anthropic ("Vision": JPEG, PNG, GIF, WebP) and OpenAI ("Images and
/// vision": PNG, JPEG, WEBP, non-animated GIF) accept.
pub const IMAGE_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// The longest base64 `data` an image may have in a request, in bytes of
/// base64 text: 5 MiB, Anthropic's per-image limit ("Vision": "maximum
/// allowed image file size is 5MB"), which its API checks on the encoded
/// text, so an image of up to about 3.75 MiB decoded passes. OpenAI allows
/// more (20 MB), so this one limit fits both.
pub const MAX_IMAGE_BASE64_LEN: usize = 5 * 1024 * 1024;

/// How many bytes standard base64 text `data` decodes to, from its length
/// alone (nothing is decoded; for sizes in notes and limits).
///
/// ```
/// assert_eq!(glia_proto::content::base64_decoded_len("aGVsbG8="), 5); // "hello"
/// ```
pub fn base64_decoded_len(data: &str) -> usize {
    let data = data.trim_end_matches('=');
    data.len() / 4 * 3 + (data.len() % 4).saturating_sub(1)
}

/// Where an image's bytes are. Anthropic's `source` object; only inline
/// base64 data exists here: `{"type": "base64", "media_type": "image/png",
/// "data": "iVBORw0KGgo…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ImageSource {
    /// The image inline.
    Base64 {
        /// MIME type, e.g. `image/png`.
        media_type: String,
        /// The bytes, standard base64 with padding.
        data: String,
    },
}

impl ImageSource {
    /// An inline image.
    pub fn base64(media_type: impl Into<String>, data: impl Into<String>) -> Self {
        ImageSource::Base64 {
            media_type: media_type.into(),
            data: data.into(),
        }
    }

    /// The declared MIME type.
    pub fn media_type(&self) -> &str {
        match self {
            ImageSource::Base64 { media_type, .. } => media_type,
        }
    }

    /// The base64 text.
    pub fn data(&self) -> &str {
        match self {
            ImageSource::Base64 { data, .. } => data,
        }
    }

    /// The decoded size in bytes ([`base64_decoded_len`] of the data).
    pub fn decoded_len(&self) -> usize {
        base64_decoded_len(self.data())
    }

    /// `image/png, 1234 bytes` (decoded size).
    pub fn describe(&self) -> String {
        format!("{}, {} bytes", self.media_type(), self.decoded_len())
    }

    /// Whether a provider API would take this image as it is: a media type
    /// of [`IMAGE_MEDIA_TYPES`], data within [`MAX_IMAGE_BASE64_LEN`] that
    /// is valid base64 and whose bytes are an image of the declared type
    /// (the APIs refuse an image whose bytes do not match its media type).
    /// Errors: why not, in words (`the data is image/jpeg, not image/png`).
    pub fn check(&self) -> Result<(), String> {
        let sniffed = self.sniff()?;
        if sniffed != self.media_type() {
            return Err(format!("the data is {sniffed}, not {}", self.media_type()));
        }
        Ok(())
    }

    /// This image as a provider API would take it, its media type taken
    /// from its bytes when the declared one is wrong; or, when no API would
    /// take it, a text saying what it was and why it is left out (never
    /// the data).
    pub fn usable(self) -> Result<ImageSource, String> {
        match self.sniff() {
            Ok(sniffed) if sniffed == self.media_type() => Ok(self),
            Ok(sniffed) => Ok(ImageSource::base64(sniffed, self.data())),
            Err(why) => Err(format!("[image left out: {}; {why}]", self.describe())),
        }
    }

    /// The media type the data's first bytes show (PNG, JPEG, GIF or WebP
    /// signatures), after the size and base64 checks.
    fn sniff(&self) -> Result<&'static str, String> {
        use base64::Engine;
        let data = self.data();
        if data.len() > MAX_IMAGE_BASE64_LEN {
            return Err(format!(
                "its base64 data is {} bytes, over the {MAX_IMAGE_BASE64_LEN} bytes a model request may carry",
                data.len()
            ));
        }
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(|e| format!("its data is not valid base64 ({e})"))?;
        match bytes.as_slice() {
            [0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, ..] => Ok("image/png"),
            [0xff, 0xd8, 0xff, ..] => Ok("image/jpeg"),
            [b'G', b'I', b'F', b'8', ..] => Ok("image/gif"),
            [
                b'R',
                b'I',
                b'F',
                b'F',
                _,
                _,
                _,
                _,
                b'W',
                b'E',
                b'B',
                b'P',
                ..,
            ] => Ok("image/webp"),
            _ if !IMAGE_MEDIA_TYPES.contains(&self.media_type()) => Err(format!(
                "{} is not a type a model accepts (PNG, JPEG, GIF or WebP)",
                self.media_type()
            )),
            _ => Err("its data is not a PNG, JPEG, GIF or WebP image".into()),
        }
    }
}

/// One turn of the conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Message {
    /// Speaker.
    pub role: Role,
    /// Blocks in order; never empty in a valid request.
    pub content: Vec<ContentBlock>,
}

impl Message {
    /// A user message with one text block.
    ///
    /// ```
    /// use glia_proto::{Message, Role};
    /// let m = Message::user("Where is my refund?");
    /// assert_eq!(m.role, Role::User);
    /// assert_eq!(m.text(), "Where is my refund?");
    /// ```
    pub fn user(text: impl Into<String>) -> Self {
        Message {
            role: Role::User,
            content: vec![ContentBlock::text(text)],
        }
    }

    /// An assistant message with one text block.
    pub fn assistant(text: impl Into<String>) -> Self {
        Message {
            role: Role::Assistant,
            content: vec![ContentBlock::text(text)],
        }
    }

    /// The concatenated text blocks (thinking excluded), joined by `\n`.
    pub fn text(&self) -> String {
        let parts: Vec<&str> = self
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        parts.join("\n")
    }

    /// The tool uses in this message, in order: `(id, name, input)`.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }
}

/// Tokens one model call consumed, by kind. Counts are tokens, never negative.
///
/// `input_tokens` excludes cached tokens; `cache_write_tokens` and
/// `cache_read_tokens` are the prompt-caching parts of the input (Anthropic's
/// `cache_creation_input_tokens` / `cache_read_input_tokens`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Usage {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Generated tokens (thinking included).
    pub output_tokens: u64,
    /// Input tokens written to the prompt cache.
    #[serde(default)]
    pub cache_write_tokens: u64,
    /// Input tokens read from the prompt cache.
    #[serde(default)]
    pub cache_read_tokens: u64,
    /// True when some of these counts are glia's estimate, not the
    /// provider's report (a server that sent no usage; see
    /// `glia_providers::estimate`). Budgets and tenant caps count estimated
    /// tokens like reported ones. A sum is estimated when any part is.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub estimated: bool,
}

impl Usage {
    /// Sum of every kind.
    pub fn total(&self) -> u64 {
        self.input_tokens + self.output_tokens + self.cache_write_tokens + self.cache_read_tokens
    }
}

impl std::ops::Add for Usage {
    type Output = Usage;
    fn add(self, o: Usage) -> Usage {
        Usage {
            input_tokens: self.input_tokens.saturating_add(o.input_tokens),
            output_tokens: self.output_tokens.saturating_add(o.output_tokens),
            cache_write_tokens: self.cache_write_tokens.saturating_add(o.cache_write_tokens),
            cache_read_tokens: self.cache_read_tokens.saturating_add(o.cache_read_tokens),
            estimated: self.estimated || o.estimated,
        }
    }
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, o: Usage) {
        *self = *self + o;
    }
}
