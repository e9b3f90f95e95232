// Counts the corpora TestWriteCorpora wrote with gpt-tokenizer (npm), as
// BenchmarkCorpus counts them with relay: each text counted once to warm
// gpt-tokenizer's merge cache, then timed, best of three. It checks each
// count against relay's. The one-letter corpus is left out unless --letter
// is given: gpt-tokenizer's merge is quadratic on one long piece.
//
//   BPE_CORPUS_DIR=/tmp/corpora go test -run=TestWriteCorpora ./internal/bpe
//   cd internal/bpe/testdata && npm install --no-save gpt-tokenizer@4.0.0 && node gpt-tokenizer.mjs /tmp/corpora
import fs from 'node:fs';
import path from 'node:path';

const dir = process.argv[2];
if (!dir) {
  console.error('usage: node gpt-tokenizer.mjs CORPUS_DIR [--letter]');
  process.exit(2);
}
const corpora = ['prose', 'gosource', 'cjkemoji'];
if (process.argv.includes('--letter')) corpora.push('letter');

for (const name of corpora) {
  const file = path.join(dir, `${name}.txt`);
  if (!fs.existsSync(file)) continue;
  const text = fs.readFileSync(file, 'utf8');
  const bytes = Buffer.byteLength(text);
  for (const enc of ['o200k_base', 'cl100k_base']) {
    const { countTokens } = await import(`gpt-tokenizer/encoding/${enc}`);
    const n = countTokens(text);
    const want = Number(fs.readFileSync(path.join(dir, `${name}.${enc}.count`), 'utf8'));
    if (n !== want) {
      console.error(`${name} ${enc}: gpt-tokenizer counts ${n}, relay ${want}`);
      process.exitCode = 1;
    }
    let best = Infinity;
    for (let i = 0; i < 3; i++) {
      const t = process.hrtime.bigint();
      countTokens(text);
      best = Math.min(best, Number(process.hrtime.bigint() - t) / 1e9);
    }
    console.log(`${name}/${enc}\t${(bytes / 1e6 / best).toFixed(1)} MB/s\t${n} tokens`);
  }
}
