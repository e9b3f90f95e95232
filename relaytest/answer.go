package relaytest

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"hash/fnv"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/tidwall/gjson"
)

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// answer is the state of one call being answered.
type answer struct {
	s    *Server
	w    http.ResponseWriter
	r    *http.Request
	f    Fault
	n    int64 // call sequence number, for ids
	body []byte
}

// write sends a complete answer; Fault.ContentType overrides contentType.
func (a *answer) write(status int, contentType string, body []byte) {
	contentType = a.contentType(contentType)
	h := a.w.Header()
	h.Set("Content-Type", contentType)
	h.Set("Content-Length", strconv.Itoa(len(body)))
	a.w.WriteHeader(status)
	a.w.Write(body)
}

func (a *answer) writeJSON(v any) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err) // our own types: cannot fail
	}
	a.write(http.StatusOK, "application/json", b)
}

// errorJSON builds an OpenAI error body; empty param or code become null.
func errorJSON(message, typ, param, code string) []byte {
	type apiError struct {
		Message string  `json:"message"`
		Type    string  `json:"type"`
		Param   *string `json:"param"`
		Code    *string `json:"code"`
	}
	e := apiError{Message: message, Type: typ}
	if param != "" {
		e.Param = &param
	}
	if code != "" {
		e.Code = &code
	}
	b, _ := json.Marshal(struct {
		Error apiError `json:"error"`
	}{e})
	return b
}

// statusErrors are the OpenAI-shaped errors of the statuses relaytest
// knows: message ("{model}" is replaced by the request's model), type, code.
var statusErrors = map[int][3]string{
	http.StatusBadRequest:            {"Invalid request: relaytest scripted a 400.", "invalid_request_error", ""},
	http.StatusUnauthorized:          {"Incorrect API key provided: sk-relay*****test. You can find your API key at https://platform.openai.com/account/api-keys.", "invalid_request_error", "invalid_api_key"},
	http.StatusForbidden:             {"You are not allowed to sample from this model.", "permission_error", ""},
	http.StatusNotFound:              {"The model `{model}` does not exist or you do not have access to it.", "invalid_request_error", "model_not_found"},
	http.StatusRequestTimeout:        {"Request timed out.", "timeout", ""},
	http.StatusConflict:              {"Another request is in progress; please try again.", "conflict", ""},
	http.StatusRequestEntityTooLarge: {"Request too large.", "invalid_request_error", "request_too_large"},
	http.StatusUnprocessableEntity:   {"Unprocessable request.", "invalid_request_error", ""},
	http.StatusTooManyRequests:       {"Rate limit reached for {model} in organization org-relaytest on requests per min (RPM): Limit 60, Used 60, Requested 1. Please try again in 1s. Visit https://platform.openai.com/account/rate-limits to learn more.", "requests", "rate_limit_exceeded"},
	http.StatusServiceUnavailable:    {"The engine is currently overloaded, please try again later.", "server_error", ""},
	http.StatusBadGateway:            {"Bad gateway.", "server_error", ""},
	http.StatusGatewayTimeout:        {"Bad gateway.", "server_error", ""},
}

// errorBody is the OpenAI-shaped error that fits status.
func errorBody(status int, model string, r *http.Request) []byte {
	if model == "" {
		model = "gpt-4o"
	}
	if e, ok := statusErrors[status]; ok {
		return errorJSON(strings.ReplaceAll(e[0], "{model}", model), e[1], "", e[2])
	}
	switch {
	case status >= 500:
		return errorJSON("The server had an error while processing your request. Sorry about that!", "server_error", "", "")
	case status >= 400:
		return errorJSON("Invalid request: relaytest scripted a "+strconv.Itoa(status)+".", "invalid_request_error", "", "")
	}
	return errorJSON("relaytest scripted status "+strconv.Itoa(status)+" for "+r.Method+" "+r.URL.Path+".", "invalid_request_error", "", "")
}

// streamErrorMessage is the message of a Fault.ErrorEvent.
const streamErrorMessage = "The server had an error while processing your request. Sorry about that!"

// usage is the token accounting of one normal answer.
type usage struct {
	prompt, completion, cached, reasoning int
	length                                bool // completion cut by the request's max tokens
}

func (a *answer) usage(ep string, req gjson.Result) usage {
	u := usage{prompt: promptTokens(ep, req), completion: a.s.cfg.completionTokens}
	if a.f.CompletionTokens > 0 {
		u.completion = a.f.CompletionTokens
	}
	if ep == epEmbeddings {
		u.completion = 0
	}
	for _, k := range []string{"max_completion_tokens", "max_tokens", "max_output_tokens"} {
		if m := req.Get(k).Int(); m > 0 {
			if int(m) < u.completion {
				u.completion, u.length = int(m), true
			}
			break
		}
	}
	u.cached = min(max(a.f.CachedTokens, 0), u.prompt)
	u.reasoning = min(max(a.f.ReasoningTokens, 0), u.completion)
	return u
}

// Wire shapes.

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
	AudioTokens  int `json:"audio_tokens"`
}

type completionDetails struct {
	ReasoningTokens          int `json:"reasoning_tokens"`
	AudioTokens              int `json:"audio_tokens"`
	AcceptedPredictionTokens int `json:"accepted_prediction_tokens"`
	RejectedPredictionTokens int `json:"rejected_prediction_tokens"`
}

type chatUsage struct {
	PromptTokens            int                `json:"prompt_tokens"`
	CompletionTokens        int                `json:"completion_tokens"`
	TotalTokens             int                `json:"total_tokens"`
	PromptTokensDetails     *promptDetails     `json:"prompt_tokens_details,omitempty"`
	CompletionTokensDetails *completionDetails `json:"completion_tokens_details,omitempty"`
}

func (u usage) chat() *chatUsage {
	return &chatUsage{
		PromptTokens:            u.prompt,
		CompletionTokens:        u.completion,
		TotalTokens:             u.prompt + u.completion,
		PromptTokensDetails:     &promptDetails{CachedTokens: u.cached},
		CompletionTokensDetails: &completionDetails{ReasoningTokens: u.reasoning},
	}
}

type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokens        int `json:"output_tokens"`
	OutputTokensDetails struct {
		ReasoningTokens int `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
	TotalTokens int `json:"total_tokens"`
}

func (u usage) responses() *respUsage {
	r := &respUsage{InputTokens: u.prompt, OutputTokens: u.completion, TotalTokens: u.prompt + u.completion}
	r.InputTokensDetails.CachedTokens = u.cached
	r.OutputTokensDetails.ReasoningTokens = u.reasoning
	return r
}

type toolCall struct {
	Index    *int   `json:"index,omitempty"`
	ID       string `json:"id,omitempty"`
	Type     string `json:"type,omitempty"`
	Function struct {
		Name      string `json:"name,omitempty"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatMessage struct {
	Role        string     `json:"role"`
	Content     *string    `json:"content"`
	Refusal     *string    `json:"refusal"`
	ToolCalls   []toolCall `json:"tool_calls,omitempty"`
	Annotations []any      `json:"annotations"`
}

type chatChoice struct {
	Index        int         `json:"index"`
	Message      chatMessage `json:"message"`
	Logprobs     any         `json:"logprobs"`
	FinishReason string      `json:"finish_reason"`
}

type chatCompletion struct {
	ID                string       `json:"id"`
	Object            string       `json:"object"`
	Created           int64        `json:"created"`
	Model             string       `json:"model"`
	Choices           []chatChoice `json:"choices"`
	Usage             *chatUsage   `json:"usage,omitempty"`
	ServiceTier       string       `json:"service_tier"`
	SystemFingerprint string       `json:"system_fingerprint"`
}

type chunkDelta struct {
	Role      string          `json:"role,omitempty"`
	Content   json.RawMessage `json:"content,omitempty"`
	Refusal   json.RawMessage `json:"refusal,omitempty"`
	ToolCalls []toolCall      `json:"tool_calls,omitempty"`
}

type chunkChoice struct {
	Index        int        `json:"index"`
	Delta        chunkDelta `json:"delta"`
	Logprobs     any        `json:"logprobs"`
	FinishReason *string    `json:"finish_reason"`
}

// envelope is a chat chunk or a legacy completion (streamed or not),
// which differ only by their choices.
type envelope[C any] struct {
	ID                string          `json:"id"`
	Object            string          `json:"object"`
	Created           int64           `json:"created"`
	Model             string          `json:"model"`
	SystemFingerprint string          `json:"system_fingerprint"`
	Choices           []C             `json:"choices"`
	Usage             json.RawMessage `json:"usage,omitempty"`
}

type chatChunk = envelope[chunkChoice]

type textChoice struct {
	Text         string  `json:"text"`
	Index        int     `json:"index"`
	Logprobs     any     `json:"logprobs"`
	FinishReason *string `json:"finish_reason"`
}

type textCompletion = envelope[textChoice]

type outputText struct {
	Type        string `json:"type"`
	Text        string `json:"text"`
	Annotations []any  `json:"annotations"`
}

type outputItem struct {
	Type    string       `json:"type,omitempty"`
	ID      string       `json:"id"`
	Status  string       `json:"status"`
	Role    string       `json:"role"`
	Content []outputText `json:"content"`
}

type response struct {
	ID                 string          `json:"id"`
	Object             string          `json:"object"`
	CreatedAt          int64           `json:"created_at"`
	Status             string          `json:"status"`
	CompletedAt        *int64          `json:"completed_at"`
	Error              any             `json:"error"`
	IncompleteDetails  any             `json:"incomplete_details"`
	Instructions       any             `json:"instructions"`
	MaxOutputTokens    any             `json:"max_output_tokens"`
	Model              string          `json:"model"`
	Output             []outputItem    `json:"output"`
	ParallelToolCalls  bool            `json:"parallel_tool_calls"`
	PreviousResponseID any             `json:"previous_response_id"`
	Reasoning          map[string]any  `json:"reasoning"`
	Store              bool            `json:"store"`
	Temperature        float64         `json:"temperature"`
	Text               map[string]any  `json:"text"`
	ToolChoice         string          `json:"tool_choice"`
	Tools              []any           `json:"tools"`
	TopP               float64         `json:"top_p"`
	Truncation         string          `json:"truncation"`
	Usage              json.RawMessage `json:"usage,omitempty"`
	User               any             `json:"user"`
	Metadata           map[string]any  `json:"metadata"`
}

func ptr[T any](v T) *T { return &v }

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return b
}

// answer gives the normal answer of a POST endpoint.
func (a *answer) answer(ep string, req gjson.Result) {
	u := a.usage(ep, req)
	model := req.Get("model").Str
	stream := req.Get("stream").Bool()
	pieces := Pieces(a.s.cfg.reply, u.completion-u.reasoning)
	if a.f.ContentFilter || a.f.Empty {
		pieces = nil
	}
	now := time.Now().Unix()
	switch ep {
	case epChat:
		id := "chatcmpl-relaytest" + itoa(a.n)
		if stream {
			a.chatStream(req, id, model, now, u, pieces)
			return
		}
		c := chatCompletion{ID: id, Object: "chat.completion", Created: now, Model: model,
			ServiceTier: "default", SystemFingerprint: "fp_relaytest"}
		msg := chatMessage{Role: "assistant", Annotations: []any{}}
		finish := a.finish(u)
		switch {
		case a.f.ContentFilter:
		case a.f.ToolCall:
			tc := toolCall{ID: "call_relaytest" + itoa(a.n), Type: "function"}
			tc.Function.Name, tc.Function.Arguments = toolName, strings.Join(toolArgs, "")
			msg.ToolCalls = []toolCall{tc}
			finish = "tool_calls"
		default:
			msg.Content = ptr(strings.Join(pieces, ""))
		}
		c.Choices = []chatChoice{{Message: msg, FinishReason: finish}}
		if !a.f.NoUsage {
			c.Usage = u.chat()
		}
		a.writeJSON(c)
	case epCompletions:
		id := "cmpl-relaytest" + itoa(a.n)
		if stream {
			a.textStream(req, id, model, now, u, pieces)
			return
		}
		finish := a.finish(u)
		c := textCompletion{ID: id, Object: "text_completion", Created: now, Model: model,
			SystemFingerprint: "fp_relaytest",
			Choices:           []textChoice{{Text: strings.Join(pieces, ""), FinishReason: &finish}}}
		if !a.f.NoUsage {
			c.Usage = mustJSON(struct {
				PromptTokens     int `json:"prompt_tokens"`
				CompletionTokens int `json:"completion_tokens"`
				TotalTokens      int `json:"total_tokens"`
			}{u.prompt, u.completion, u.prompt + u.completion})
		}
		a.writeJSON(c)
	case epResponses:
		resp := a.response(req, model, now, u, strings.Join(pieces, ""))
		if a.f.ContentFilter || a.f.Empty {
			resp.Output = []outputItem{}
		}
		if a.f.ContentFilter {
			resp.Status, resp.CompletedAt = "incomplete", nil
			resp.IncompleteDetails = map[string]string{"reason": "content_filter"}
		}
		if stream {
			a.responsesStream(resp, pieces)
			return
		}
		a.writeJSON(resp)
	case epEmbeddings:
		a.embeddings(req, model, u)
	}
}

const toolName = "get_weather"

// toolArgs are the pieces of the arguments of a ToolCall answer.
var toolArgs = []string{`{"`, `city`, `":"`, `Paris`, `"}`}

// response builds a completed Responses API object.
func (a *answer) response(req gjson.Result, model string, now int64, u usage, text string) *response {
	r := &response{
		ID: "resp_relaytest" + itoa(a.n), Object: "response", CreatedAt: now, Status: "completed",
		CompletedAt: &now, Model: model, ParallelToolCalls: true, Store: true, Temperature: 1,
		Reasoning:  map[string]any{"effort": nil, "summary": nil},
		Text:       map[string]any{"format": map[string]any{"type": "text"}},
		ToolChoice: "auto", Tools: []any{}, TopP: 1, Truncation: "disabled", Metadata: map[string]any{},
		Output: []outputItem{{Type: "message", ID: "msg_relaytest" + itoa(a.n), Status: "completed", Role: "assistant",
			Content: []outputText{{Type: "output_text", Text: text, Annotations: []any{}}}}},
	}
	if v := req.Get("instructions"); v.Type == gjson.String {
		r.Instructions = v.Str
	}
	if v := req.Get("max_output_tokens"); v.Type == gjson.Number {
		r.MaxOutputTokens = v.Int()
	}
	if !a.f.NoUsage {
		r.Usage = mustJSON(u.responses())
	}
	return r
}

// embeddings answers with small deterministic unit vectors, one per input.
func (a *answer) embeddings(req gjson.Result, model string, u usage) {
	var inputs []string
	in := req.Get("input")
	switch {
	case in.IsArray() && len(in.Array()) > 0 && in.Array()[0].Type != gjson.Number:
		for _, e := range in.Array() {
			inputs = append(inputs, e.Raw)
		}
	default:
		inputs = []string{in.Raw}
	}
	dims := int(req.Get("dimensions").Int())
	if dims <= 0 || dims > 4096 {
		dims = 8
	}
	b64 := req.Get("encoding_format").Str == "base64"
	type embedding struct {
		Object    string `json:"object"`
		Index     int    `json:"index"`
		Embedding any    `json:"embedding"`
	}
	data := make([]embedding, len(inputs))
	for i, text := range inputs {
		v := vector(text, dims)
		data[i] = embedding{Object: "embedding", Index: i, Embedding: v}
		if b64 {
			buf := make([]byte, 4*len(v))
			for j, x := range v {
				binary.LittleEndian.PutUint32(buf[4*j:], math.Float32bits(x))
			}
			data[i].Embedding = base64.StdEncoding.EncodeToString(buf)
		}
	}
	out := struct {
		Object string      `json:"object"`
		Data   []embedding `json:"data"`
		Model  string      `json:"model"`
		Usage  any         `json:"usage,omitempty"`
	}{Object: "list", Data: data, Model: model}
	if !a.f.NoUsage {
		out.Usage = struct {
			PromptTokens int `json:"prompt_tokens"`
			TotalTokens  int `json:"total_tokens"`
		}{u.prompt, u.prompt}
	}
	a.writeJSON(out)
}

// vector derives a unit vector of dims float32s from text.
func vector(text string, dims int) []float32 {
	h := fnv.New64a()
	h.Write([]byte(text))
	x := h.Sum64() | 1
	v := make([]float32, dims)
	var norm float64
	for i := range v {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		f := float64(x>>11)/float64(1<<53)*2 - 1
		v[i] = float32(f)
		norm += f * f
	}
	norm = math.Sqrt(norm)
	for i := range v {
		v[i] = float32(float64(v[i]) / norm)
	}
	return v
}

// models answers GET /models.
func (a *answer) models() {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	data := make([]model, len(a.s.cfg.models))
	for i, id := range a.s.cfg.models {
		data[i] = model{ID: id, Object: "model", Created: 1700000000, OwnedBy: "relaytest"}
	}
	a.writeJSON(struct {
		Object string  `json:"object"`
		Data   []model `json:"data"`
	}{"list", data})
}

// model answers GET /models/{id}.
func (a *answer) model(id string) {
	for _, m := range a.s.cfg.models {
		if m == id {
			a.writeJSON(struct {
				ID      string `json:"id"`
				Object  string `json:"object"`
				Created int64  `json:"created"`
				OwnedBy string `json:"owned_by"`
			}{id, "model", 1700000000, "relaytest"})
			return
		}
	}
	a.write(http.StatusNotFound, "application/json", errorJSON(
		"The model '"+id+"' does not exist", "invalid_request_error", "model", "model_not_found"))
}

// finish is the finish_reason of a normal chat or completions answer:
// "content_filter" for a Fault.ContentFilter, "length" when the request's
// max tokens cut it, else "stop".
func (a *answer) finish(u usage) string {
	switch {
	case a.f.ContentFilter:
		return "content_filter"
	case u.length:
		return "length"
	}
	return "stop"
}

// contentType is the Content-Type of an answer whose own is ct: the
// fault's ContentType, else its Header's, else ct.
func (a *answer) contentType(ct string) string {
	switch {
	case a.f.ContentType != "":
		return a.f.ContentType
	case a.f.Header.Get("Content-Type") != "":
		return a.f.Header.Get("Content-Type")
	}
	return ct
}
