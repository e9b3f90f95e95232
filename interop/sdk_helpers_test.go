package interop

import (
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/responses"
)

func responsesParams(input string) responses.ResponseNewParams {
	return responses.ResponseNewParams{
		Model: "gpt-4.1",
		Input: responses.ResponseNewParamsInputUnion{OfString: openai.String(input)},
	}
}
