// Parses every fenced ```mermaid block of the given Markdown files with Mermaid's own parser (the
// one GitHub's renderer runs), and fails naming the file and line of each block that does not
// parse. Run by scripts/check-diagrams.sh, which installs the pinned packages of package.json.
//
// Usage: node check.mjs FILE.md…   (exit 0: every block parses; 1: some block does not; 2: usage)
import { readFileSync } from 'node:fs';
import { JSDOM } from 'jsdom';

// Mermaid sanitises labels with DOMPurify, which needs a DOM: without one, a state diagram or a
// flowchart fails with "DOMPurify.addHook is not a function" whether it is right or wrong.
const dom = new JSDOM('<!doctype html><html><body></body></html>');
globalThis.window = dom.window;
globalThis.document = dom.window.document;
const { default: mermaid } = await import('mermaid');
mermaid.initialize({ startOnLoad: false });

/** The fenced mermaid blocks of one Markdown text: the line of the opening fence and the body. */
function mermaidBlocks(text) {
  const blocks = [];
  const lines = text.split('\n');
  let open = null; // { fence, line, body } while inside a fenced block
  lines.forEach((line, index) => {
    if (open === null) {
      // CommonMark: up to three spaces, then three or more backticks or tildes, then the info
      // string, whose first word is the language; after backticks it may hold no backtick (a line
      // like ```` ```x ```` is inline code, not a fence).
      const start = /^ {0,3}(`{3,}|~{3,})(.*)$/.exec(line);
      if (start && !(start[1][0] === '`' && start[2].includes('`'))) {
        const lang = start[2].trim().split(/\s+/)[0];
        open = { fence: start[1], lang, line: index + 1, body: [] };
      }
    } else if (new RegExp(`^ {0,3}${open.fence[0]}{${open.fence.length},}\\s*$`).test(line)) {
      if (open.lang === 'mermaid') blocks.push({ line: open.line, text: open.body.join('\n') });
      open = null;
    } else {
      open.body.push(line);
    }
  });
  if (open !== null && open.lang === 'mermaid') {
    blocks.push({ line: open.line, text: open.body.join('\n'), unclosed: true });
  }
  return blocks;
}

const files = process.argv.slice(2);
if (files.length === 0) {
  console.error('usage: node check.mjs FILE.md…');
  process.exit(2);
}

let parsed = 0;
let failed = 0;
for (const file of files) {
  for (const block of mermaidBlocks(readFileSync(file, 'utf8'))) {
    if (block.unclosed) {
      console.error(`${file}:${block.line}: the mermaid block is never closed`);
      failed += 1;
      continue;
    }
    try {
      // parse() throws on an error (it returns false only with suppressErrors).
      await mermaid.parse(block.text);
      parsed += 1;
    } catch (error) {
      const message = String(error?.message ?? error);
      // Mermaid counts lines within the block; the block's first line follows the fence.
      const within = /on line (\d+)/.exec(message);
      const line = block.line + (within ? Number(within[1]) : 1);
      console.error(`${file}:${line}: the mermaid block opened at line ${block.line} does not parse:`);
      console.error(message.replace(/^/gm, '    '));
      failed += 1;
    }
  }
}

if (failed > 0) {
  console.error(`${failed} mermaid block(s) do not parse; ${parsed} do`);
  process.exit(1);
}
console.log(`${parsed} mermaid block(s) parse`);
