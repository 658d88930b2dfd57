/**
 * The sidebar's inline-completion section: a chooser of installed models
 * (choosing one sets the `jupyter-llm:completion` model setting) and a
 * status line that says why no completion appears, when none can.
 */
import { CompletionState } from './completion_state';

export class CompletionSection {
  readonly node: HTMLElement;
  private select: HTMLSelectElement;
  private status: HTMLElement;
  private draws = 0;

  constructor(private state: CompletionState) {
    this.node = document.createElement('section');
    this.node.className = 'jp-LLM-completion';
    const heading = document.createElement('h3');
    heading.className = 'jp-LLM-heading';
    heading.textContent = 'Inline completion';
    const label = document.createElement('label');
    label.className = 'jp-LLM-completion-label';
    label.textContent = 'Model ';
    this.select = document.createElement('select');
    this.select.className = 'jp-LLM-completion-model';
    this.select.addEventListener('focus', () => void this.refresh());
    this.select.addEventListener('change', () => {
      void this.state.choose(this.select.value).catch(error => this.show(String(error), true));
    });
    label.append(this.select);
    this.status = document.createElement('p');
    this.status.className = 'jp-LLM-completion-status';
    this.node.append(heading, label, this.status);
    state.changed.connect(() => void this.refresh());
  }

  /** Redraws the chooser and the status line; an older draw never wins over a newer. */
  async refresh(): Promise<void> {
    const draw = ++this.draws;
    let models: string[] = [];
    let problem: string | null;
    try {
      [models, problem] = await Promise.all([this.state.installed(), this.state.problem()]);
    } catch (error) {
      problem = `Cannot ask the server: ${error instanceof Error ? error.message : error}`;
    }
    if (draw !== this.draws) {
      return;
    }
    this.fillChooser(models);
    const error = this.state.error;
    if (problem) {
      this.show(problem, true);
    } else if (error) {
      this.show(`Last completion failed: ${error}`, true);
    } else {
      this.show(`Completing with ${this.state.settings.model}.`, false);
    }
  }

  private fillChooser(models: string[]): void {
    const chosen = this.state.settings.model;
    const names = chosen && !models.includes(chosen) ? [chosen, ...models] : models;
    this.select.replaceChildren(
      new Option('(none)', ''),
      ...names.map(name => new Option(name, name))
    );
    this.select.value = chosen;
  }

  private show(text: string, problem: boolean): void {
    this.status.textContent = text;
    this.status.classList.toggle('jp-LLM-completion-problem', problem);
  }
}
