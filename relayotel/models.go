package relayotel

import (
	"github.com/tokenrelay/relay"
	"github.com/tokenrelay/relay/internal/modelset"
)

// otherModel is the gen_ai.request.model and gen_ai.response.model the
// metrics record for a model the Observer does not know: the value the
// conventions give an attribute outside its known set (error.type,
// http.request.method).
const otherModel = "_OTHER"

// defaultModelLimit is how many model names an Observer learns unless
// WithModelLimit says otherwise; relayprom learns as many.
const defaultModelLimit = modelset.DefaultLimit

// models is the set of model names the metrics record as themselves: those
// given to New, and those learned from calls, up to a limit; any other
// name is recorded as otherModel.
type models struct{ modelset.Set }

func (m *models) init(names []string, limit int) { m.Init(names, limit) }

// bound returns the name the metrics record for model: model itself when
// it is known or learned now (learn: the call says the model is real),
// otherModel when it is not, "" when there is none.
func (m *models) bound(model string, learn bool) string {
	switch {
	case model == "":
		return ""
	case m.Bound(model, learn):
		return model
	}
	return otherModel
}

// vouched reports whether r shows its models to be real, for the Observer
// to learn them (modelset.Vouched).
func vouched(r *relay.Report) bool { return modelset.Vouched(r.Attempts, r.StatusCode) }
