"""Where the ``base`` stage's time goes: one supervised step of the tiny model split into
batch building, forward, loss, backward, gradient clipping and the optimizer step.

    python benchmarks/base_split.py

The same work as :func:`rollscale.lm.models.train_supervised` at the default
``base`` params (batch 128, label smoothing 0.2, one torch thread), timed per
phase over 35 steps after 5 warm-up steps.
"""
import time, torch, math
torch.set_num_threads(1)
from rollscale.lm.models import char_tokenizer, tiny_llama
from rollscale.config import DataParams
from tasks.problems import load_pool
tok = char_tokenizer(); m = tiny_llama(len(tok)); m.train()
pool = load_pool(DataParams(), size=2000, seed=12345)
pairs=[(p.prompt,p.answer) for p in pool]
pi=[tok(p, add_special_tokens=False)["input_ids"] for p,_ in pairs]; ai=[tok(a, add_special_tokens=False)["input_ids"] for _,a in pairs]
opt=torch.optim.AdamW(m.parameters(), lr=1e-3); gen=torch.Generator().manual_seed(0)
T={k:0.0 for k in ["batch","forward","loss","backward","clip","optimizer"]}
B=128; bos,eos,pad=tok.bos_token_id,tok.eos_token_id,tok.pad_token_id
for step in range(40):
    t=time.perf_counter()
    idx=torch.randint(len(pairs),(B,),generator=gen).tolist()
    seqs=[[bos,*pi[i],*ai[i],eos] for i in idx]; npr=[1+len(pi[i]) for i in idx]; w=max(map(len,seqs))
    ids=torch.full((B,w),pad); lab=torch.full((B,w),-100); att=torch.zeros((B,w),dtype=torch.long)
    for r,(s,n) in enumerate(zip(seqs,npr)):
        ids[r,:len(s)]=torch.tensor(s); att[r,:len(s)]=1; lab[r,n:len(s)]=torch.tensor(s[n:])
    t1=time.perf_counter(); lg=m(input_ids=ids,attention_mask=att).logits[:,:-1]; t2=time.perf_counter()
    loss=torch.nn.functional.cross_entropy(lg.reshape(-1,lg.shape[-1]),lab[:,1:].reshape(-1),ignore_index=-100,label_smoothing=0.2); t3=time.perf_counter()
    opt.zero_grad(); loss.backward(); t4=time.perf_counter()
    torch.nn.utils.clip_grad_norm_(m.parameters(),1.0); t5=time.perf_counter(); opt.step(); loss.item(); t6=time.perf_counter()
    if step>=5:
        for k,a,b in [("batch",t,t1),("forward",t1,t2),("loss",t2,t3),("backward",t3,t4),("clip",t4,t5),("optimizer",t5,t6)]: T[k]+=b-a
tot=sum(T.values()); print(f"width~{w}, per step {tot/35*1000:.1f} ms"); [print(f"{k}: {v/35*1000:.1f} ms ({v/tot:.0%})") for k,v in T.items()]
