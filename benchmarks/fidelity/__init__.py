"""What a choice costs a real model's predictions, teacher-forced on SmolLM2-135M-Instruct: an
int8 KV cache (kv_int8), the experts' quantization (moe), each precision's answers to factual
questions against llama.cpp's (answers)."""
