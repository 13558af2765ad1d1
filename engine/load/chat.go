package load

import (
	"encoding/json"
	"os"
	"path/filepath"
)

// readChatTemplate returns tokenizer_config.json's chat_template, or "" when there is none
// (callers then use ChatML).
func readChatTemplate(dir string) string {
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return ""
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if json.Unmarshal(b, &cfg) != nil {
		return ""
	}
	return cfg.ChatTemplate
}
