// percept-peer-greedy: llama.cpp's own C API, driven the plainest way, as the reference for
// parity tests. Prints the greedy continuation of a prompt as a JSON array of token ids.
// usage: percept-peer-greedy MODEL.gguf N_PREDICT PROMPT
#include "llama.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

static void quiet_log(ggml_log_level, const char *, void *) {}

int main(int argc, char ** argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s MODEL.gguf N_PREDICT PROMPT\n", argv[0]);
        return 2;
    }
    const std::string path = argv[1];
    const int n_predict = atoi(argv[2]);
    const std::string prompt = argv[3];

    llama_log_set(quiet_log, nullptr);
    ggml_backend_load_all();
    llama_model_params mparams = llama_model_default_params();
    mparams.n_gpu_layers = getenv("PEER_NGL") ? atoi(getenv("PEER_NGL")) : 0;
    llama_model * model = llama_model_load_from_file(path.c_str(), mparams);
    if (!model) { fprintf(stderr, "failed to load %s\n", path.c_str()); return 1; }
    const llama_vocab * vocab = llama_model_get_vocab(model);

    const int n_prompt = -llama_tokenize(vocab, prompt.c_str(), prompt.size(), nullptr, 0, true, true);
    std::vector<llama_token> tokens(n_prompt);
    if (llama_tokenize(vocab, prompt.c_str(), prompt.size(), tokens.data(), tokens.size(), true, true) < 0) {
        fprintf(stderr, "tokenize failed\n");
        return 1;
    }

    llama_context_params cparams = llama_context_default_params();
    cparams.n_ctx = n_prompt + n_predict + 8;
    cparams.n_batch = n_prompt > 512 ? n_prompt : 512;
    cparams.no_perf = true;
    llama_context * ctx = llama_init_from_model(model, cparams);
    if (!ctx) { fprintf(stderr, "failed to create context\n"); return 1; }

    llama_sampler * smpl = llama_sampler_chain_init(llama_sampler_chain_default_params());
    llama_sampler_chain_add(smpl, llama_sampler_init_greedy());

    llama_batch batch = llama_batch_get_one(tokens.data(), tokens.size());
    llama_token next;
    printf("[");
    for (int i = 0; i < n_predict; i++) {
        if (llama_decode(ctx, batch)) { fprintf(stderr, "decode failed\n"); return 1; }
        next = llama_sampler_sample(smpl, ctx, -1);
        printf(i ? ",%d" : "%d", next);
        batch = llama_batch_get_one(&next, 1);
    }
    printf("]\n");
    llama_sampler_free(smpl);
    llama_free(ctx);
    llama_model_free(model);
    return 0;
}
