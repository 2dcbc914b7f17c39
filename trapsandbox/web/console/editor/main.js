// The console's code editor: CodeMirror 6 with Lua, bundled by esbuild into ../editor.js
// (`npm ci && npm run build` here: make runs it, and setup.py when a wheel is built).
// The page uses only window.TrapEditor.create(host, options) below; the rest stays inside.
import { EditorState, Compartment } from "@codemirror/state";
import {
  EditorView, keymap, lineNumbers, highlightActiveLine, highlightActiveLineGutter,
  drawSelection, highlightSpecialChars,
} from "@codemirror/view";
import { defaultKeymap, history, historyKeymap, indentWithTab } from "@codemirror/commands";
import {
  StreamLanguage, syntaxHighlighting, defaultHighlightStyle, indentOnInput, bracketMatching,
} from "@codemirror/language";
import { searchKeymap, highlightSelectionMatches } from "@codemirror/search";
import { lua } from "@codemirror/legacy-modes/mode/lua";

const dark = EditorView.theme({
  "&": { color: "#e6e6e6", backgroundColor: "#15171b", height: "100%" },
  ".cm-content": { caretColor: "#7fcc19", fontFamily: "\"DejaVu Sans Mono\", monospace" },
  ".cm-gutters": { backgroundColor: "#1b1d22", color: "#888", border: "none" },
  ".cm-activeLine, .cm-activeLineGutter": { backgroundColor: "#22262d" },
  "&.cm-focused .cm-selectionBackground, .cm-selectionBackground": { backgroundColor: "#3a4150" },
  "&.cm-focused": { outline: "2px solid #7fcc19" },
}, { dark: true });

// The editor lives in a shadow root of `host`: there CodeMirror's styles are constructed
// style sheets (adoptedStyleSheets), which the page's strict CSP (style-src 'self') allows;
// in the document itself they would be a <style> element, which it blocks.
// options: {text, lua: bool, readOnly: bool, onChange(), onSave(), label}
function create(host, options) {
  const root = host.shadowRoot || host.attachShadow({ mode: "open" });
  const editable = new Compartment();
  const view = new EditorView({
    parent: root,
    root,
    state: EditorState.create({
      doc: options.text,
      extensions: [
        lineNumbers(), highlightActiveLineGutter(), highlightSpecialChars(), history(),
        drawSelection(), indentOnInput(), bracketMatching(), highlightActiveLine(),
        highlightSelectionMatches(), syntaxHighlighting(defaultHighlightStyle), dark,
        options.lua ? StreamLanguage.define(lua) : [],
        EditorState.tabSize.of(2),
        keymap.of([
          { key: "Mod-s", preventDefault: true, run: () => { options.onSave(); return true; } },
          indentWithTab, ...defaultKeymap, ...historyKeymap, ...searchKeymap,
        ]),
        editable.of(EditorState.readOnly.of(Boolean(options.readOnly))),
        EditorView.contentAttributes.of({ "aria-label": options.label || "File" }),
        EditorView.updateListener.of((update) => { if (update.docChanged) options.onChange(); }),
      ],
    }),
  });
  return {
    text: () => view.state.doc.toString(),
    setText(text) {
      view.dispatch({ changes: { from: 0, to: view.state.doc.length, insert: text } });
    },
    setReadOnly(flag) {
      view.dispatch({ effects: editable.reconfigure(EditorState.readOnly.of(flag)) });
    },
    focus: () => view.focus(),
    destroy: () => view.destroy(),
  };
}

window.TrapEditor = { create };
